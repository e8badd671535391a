"""ModelRegistry: Hugging Face architecture name -> "module:Class", imported only when used.

Built-in models are listed here; plugins add theirs through the ``register_models`` hook, whose
results go through ``register_models`` below. Registering an architecture twice with the same
class is harmless (hooks may run more than once per process); with a different class it is an
error naming both providers.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("tokenmill")

BUILTIN_SOURCE = "tokenmill"
TRANSFORMERS_FALLBACK = "tokenmill.models.transformers_fallback:TransformersCausalLM"

BUILTIN_MODELS: dict[str, str] = {
    "LlamaForCausalLM": "tokenmill.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "tokenmill.models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "tokenmill.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "tokenmill.models.qwen3:Qwen3ForCausalLM",
    "Gemma2ForCausalLM": "tokenmill.models.gemma2:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "tokenmill.models.gemma3:Gemma3ForCausalLM",
    "Phi3ForCausalLM": "tokenmill.models.phi3:Phi3ForCausalLM",
    "MixtralForCausalLM": "tokenmill.models.mixtral:MixtralForCausalLM",
    "Qwen2MoeForCausalLM": "tokenmill.models.qwen2_moe:Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": "tokenmill.models.qwen3_moe:Qwen3MoeForCausalLM",
    "BertModel": "tokenmill.models.bert:BertModel",
    **{name: f"tokenmill.models.decoder_embedding:{name}"
       for name in ("LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model", "Gemma2Model", "Gemma3TextModel")},
}


DEFAULT_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "bert": "BertModel",
}
"""model_type -> architecture, for configs without ``architectures`` (e.g. built from GGUF metadata)."""


class ModelRegistryError(ValueError):
    """A clash between two providers of one architecture, or a malformed entry."""


class UnsupportedArchitectureError(ValueError):
    """No registered model implements the checkpoint's architecture."""


class ModelRegistry:
    """Architecture names to lazily imported model classes, each with the name of its provider."""

    def __init__(self, builtin: Mapping[str, str] = BUILTIN_MODELS):
        self._entries: dict[str, tuple[str, str]] = {}
        self.register_all(builtin, BUILTIN_SOURCE)

    def register(self, architecture: str, path: str, source: str = "a plugin") -> None:
        """Map ``architecture`` to ``path`` ("package.module:Class") provided by ``source``."""
        module, _, attr = path.partition(":")
        if not module or not attr:
            raise ModelRegistryError(f"{source} registers {architecture} as {path!r}; expected 'package.module:Class'")
        existing = self._entries.get(architecture)
        if existing is not None and existing[0] != path:
            raise ModelRegistryError(f"architecture {architecture} is provided twice: by {existing[1]} "
                                     f"({existing[0]}) and by {source} ({path})")
        self._entries[architecture] = (path, source)

    def register_all(self, mapping: Mapping[str, str], source: str = "a plugin") -> None:
        """``register`` every entry of ``mapping`` (one plugin's ``register_models`` result)."""
        for architecture, path in mapping.items():
            self.register(architecture, path, source)

    def supported(self) -> list[str]:
        return sorted(self._entries)

    def provider(self, architecture: str) -> str:
        return self._entries[architecture][1]

    def resolve(self, architecture: str) -> type:
        """Import and return the class registered for ``architecture``."""
        if architecture not in self._entries:
            raise UnsupportedArchitectureError(
                f"architecture {architecture!r} is not supported; supported: {', '.join(self.supported())}"
            )
        path, source = self._entries[architecture]
        module_name, _, attr = path.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as error:
            raise ModelRegistryError(f"{source} registers {architecture} as {path}, which cannot be imported: "
                                     f"{error}") from error

    def _native(self, hf_config: Any) -> tuple[str | None, list[str]]:
        """(the first registered architecture of ``hf_config``, or None; the architectures it names)."""
        architectures = list(getattr(hf_config, "architectures", None) or [])
        model_type = getattr(hf_config, "model_type", None)
        if not architectures and model_type in DEFAULT_ARCHITECTURES:
            architectures = [DEFAULT_ARCHITECTURES[model_type]]
        return next((a for a in architectures if a in self._entries), None), architectures

    def describe(self, hf_config: Any) -> str:
        """Which implementation ``resolve_config`` would pick, in words (for reports and explain)."""
        from tokenmill.models.transformers_fallback import causal_lm_class_name

        native, architectures = self._native(hf_config)
        if native is not None:
            return f"{native} ({self._entries[native][1]})"
        fallback = causal_lm_class_name(hf_config)
        if fallback is not None:
            return f"{fallback} (transformers fallback: no native implementation)"
        return f"none: {', '.join(architectures) or getattr(hf_config, 'model_type', None)!r} is not supported"

    def resolve_config(self, hf_config: Any) -> type:
        """The class for the first architecture in ``hf_config.architectures`` that is registered;
        a config without ``architectures`` falls back to its ``model_type``'s usual architecture.
        With no native implementation, a decoder transformers implements runs through the
        transformers fallback (logged)."""
        native, architectures = self._native(hf_config)
        if native is not None:
            return self.resolve(native)
        model_type = getattr(hf_config, "model_type", None)
        named = ", ".join(architectures) or f"none listed, model_type {model_type!r}"
        from tokenmill.models.transformers_fallback import causal_lm_class_name

        if causal_lm_class_name(hf_config) is not None:
            logger.info("no native implementation for %s: using the transformers fallback", named)
            module_name, _, attr = TRANSFORMERS_FALLBACK.partition(":")
            return getattr(importlib.import_module(module_name), attr)
        raise UnsupportedArchitectureError(
            f"the checkpoint's architecture ({named}) is not supported; supported: {', '.join(self.supported())} "
            f"(and transformers has no causal LM for it to fall back on)"
        )


MODEL_REGISTRY = ModelRegistry()
"""The process-wide registry the loader resolves models from."""


def register(architecture: str, path: str, source: str = "a plugin") -> None:
    """Add one architecture to the process-wide registry."""
    MODEL_REGISTRY.register(architecture, path, source)


def register_models(mapping: Mapping[str, str], source: str = "a plugin") -> None:
    """Add a plugin's ``register_models`` hook result to the process-wide registry."""
    MODEL_REGISTRY.register_all(mapping, source)


def resolve_model_class(hf_config: Any) -> type:
    """The model class for a Hugging Face config, from the process-wide registry."""
    return MODEL_REGISTRY.resolve_config(hf_config)
