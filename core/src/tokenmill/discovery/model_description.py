"""ModelDescription: what selection needs to know about a checkpoint, read without its weights.

A directory is read through its ``config.json``; a ``.gguf`` file through the quantizer that
detects it (``Quantizer.hf_config``). From the config come the attention specs (one per layer
type, e.g. full and sliding-window layers) and the linear-layer shapes of a decoder layer plus the
LM head, which selection walks for kernels.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenmill.discovery.checkpoint_format import CheckpointFormat
from tokenmill.discovery.quantizer_choice import UNQUANTIZED, unclaimed_format_error
from tokenmill.discovery.record import PluginRecord
from tokenmill.discovery.registry import PluginRegistry
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import AttentionSpec, LinearSpec

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def _checkpoint_dtype(config: Mapping[str, Any]) -> str | None:
    dtype = config.get("dtype") or config.get("torch_dtype")
    return str(dtype).removeprefix("torch.") if dtype else None


@dataclass
class ModelDescription:
    """A checkpoint's config and where it came from."""

    model_path: str
    hf_config: dict[str, Any]
    source: str
    notes: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, registry: PluginRegistry, model_path: str) -> ModelDescription:
        """Read the config of a model directory, a config.json file or a .gguf file."""
        path = os.path.abspath(os.path.expanduser(model_path))
        if os.path.isdir(path):
            config_file = os.path.join(path, "config.json")
            if not os.path.isfile(config_file):
                raise SelectionError(f"{model_path} is a directory without a config.json")
            return cls(path, _read_json(config_file), "config.json")
        if path.endswith(".json") and os.path.isfile(path):
            return cls(os.path.dirname(path), _read_json(path), os.path.basename(path))
        if path.endswith(".gguf") and os.path.isfile(path):
            return _from_checkpoint_file(registry, path)
        raise SelectionError(f"{model_path}: expected a model directory with config.json or a .gguf file")

    @property
    def text_config(self) -> Mapping[str, Any]:
        """The language-model part of the config (multimodal configs nest it), with transformers'
        standard names filled in from the model's own (GPT-2's ``n_embd`` is ``hidden_size``)."""
        nested = self.hf_config.get("text_config")
        config = nested if isinstance(nested, Mapping) and "num_attention_heads" not in self.hf_config else self.hf_config
        return _with_standard_names(config)

    def implementation(self) -> str:
        """The model class tokenmill would run, native or the transformers fallback, in words."""
        from tokenmill.loader.model_loader import as_hf_config
        from tokenmill.models.registry import MODEL_REGISTRY

        try:
            return MODEL_REGISTRY.describe(as_hf_config(self.hf_config))
        except (ValueError, KeyError) as error:
            return f"unknown ({error})"

    @property
    def checkpoint_dtype(self) -> str | None:
        """The dtype the weights were saved in, when the config says."""
        return _checkpoint_dtype(self.text_config) or _checkpoint_dtype(self.hf_config)

    def _shape(self) -> tuple[int, int, int, int]:
        config = self.text_config
        try:
            hidden, num_heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        except (KeyError, TypeError, ValueError) as error:
            raise SelectionError(f"{self.model_path}: the config lacks {error} (hidden_size, num_attention_heads)") from None
        num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
        head_size = int(config.get("head_dim") or hidden // num_heads)
        return hidden, num_heads, num_kv_heads, head_size

    def attention_specs(self, dtype: str, kv_cache_dtype: str = "auto", block_size: int = 16) -> dict[str, AttentionSpec]:
        """One attention spec per layer type ("full_attention", "sliding_attention")."""
        config = self.text_config
        _, num_heads, num_kv_heads, head_size = self._shape()
        scalar = config.get("query_pre_attn_scalar")
        scale = float(scalar) ** -0.5 if scalar else head_size ** -0.5
        window = config.get("sliding_window") if config.get("use_sliding_window", True) is not False else None
        softcap = config.get("attn_logit_softcapping")

        def spec(sliding_window: int | None) -> AttentionSpec:
            return AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size, scale=scale,
                                 dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size,
                                 sliding_window=int(sliding_window) if sliding_window else None,
                                 logits_soft_cap=float(softcap) if softcap else None)

        layer_types = set(config.get("layer_types") or ())
        if window and layer_types == {FULL_ATTENTION, SLIDING_ATTENTION}:
            return {FULL_ATTENTION: spec(None), SLIDING_ATTENTION: spec(window)}
        kind = SLIDING_ATTENTION if window and layer_types != {FULL_ATTENTION} else FULL_ATTENTION
        return {kind: spec(window if kind == SLIDING_ATTENTION else None)}

    def linear_specs(self, dtype: str) -> list[LinearSpec]:
        """The linear layers of decoder layer 0 (all layers share their shapes) and the LM head."""
        config = self.text_config
        hidden, num_heads, num_kv_heads, head_size = self._shape()
        intermediate = int(config.get("intermediate_size") or 4 * hidden)
        vocab = int(config.get("vocab_size") or 0)
        qkv_bias = bool(config.get("attention_bias", config.get("model_type") == "qwen2"))
        o_bias = bool(config.get("attention_bias", False))
        mlp_bias = bool(config.get("mlp_bias", False))
        q, kv = num_heads * head_size, num_kv_heads * head_size
        layer = "model.layers.0"
        specs = [
            LinearSpec(f"{layer}.self_attn.qkv_proj", hidden, q + 2 * kv, (q, kv, kv), qkv_bias, dtype),
            LinearSpec(f"{layer}.self_attn.o_proj", q, hidden, (hidden,), o_bias, dtype),
            LinearSpec(f"{layer}.mlp.gate_up_proj", hidden, 2 * intermediate, (intermediate, intermediate), mlp_bias, dtype),
            LinearSpec(f"{layer}.mlp.down_proj", intermediate, hidden, (hidden,), mlp_bias, dtype),
        ]
        if vocab:
            specs.append(LinearSpec("lm_head", hidden, vocab, (vocab,), False, dtype))
        return specs


def _with_standard_names(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` plus the standard keys its transformers config class aliases (``attribute_map``)."""
    aliases: Mapping[str, str] = {}
    try:
        from transformers import CONFIG_MAPPING

        aliases = CONFIG_MAPPING[config["model_type"]].attribute_map
    except (ImportError, KeyError):
        pass
    missing = {alias: config[name] for alias, name in aliases.items() if alias not in config and name in config}
    return {**config, **missing} if missing else config


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise SelectionError(f"cannot read {path}: {error}") from None


def recognising_quantizers(registry: PluginRegistry, path: str) -> tuple[list[tuple[float, PluginRecord]], list[str]]:
    """(confidence, record) of the available quantizers whose ``detect`` recognises the checkpoint
    file ``path`` (no config.json), most confident first; with a note for each whose ``detect`` raised."""
    notes = []
    ranked = []
    for record in registry.available("quantizer"):
        try:
            confidence = float(record.obj.detect({}, path))
        except Exception as error:  # reported, and the next quantizer is asked
            notes.append(f"quantizer '{record.name}' detect() raised {type(error).__name__}: {error}")
            continue
        if confidence > 0:
            ranked.append((confidence, record))
    return sorted(ranked, key=lambda pair: (-pair[0], pair[1].name)), notes


def _from_checkpoint_file(registry: PluginRegistry, path: str) -> ModelDescription:
    """Ask the quantizers that recognise the file for its embedded config, most confident first."""
    ranked, notes = recognising_quantizers(registry, path)
    for _, record in ranked:
        try:
            config = record.obj.from_config({}, path).hf_config(path)
        except Exception as error:  # reported, and the next quantizer is asked
            notes.append(f"quantizer '{record.name}' could not read the config from {os.path.basename(path)}: "
                         f"{type(error).__name__}: {error}")
            continue
        if config:
            return ModelDescription(path, dict(config), f"{record.name} metadata", notes)
        notes.append(f"quantizer '{record.name}' recognises {os.path.basename(path)} but supplies no config")
    declared = CheckpointFormat.read({}, path)
    if declared is not None and all(record.name == UNQUANTIZED for _, record in ranked):  # only the float fallback
        raise unclaimed_format_error(registry, declared)
    reasons = [note for note in notes if "supplies no config" not in note]  # the others say why
    if not reasons:
        reasons = ["the file is empty" if os.path.getsize(path) == 0 else
                   "no installed quantization format recognises the file"]
    raise SelectionError(f"cannot read a model config from {path}: {'; '.join(reasons)}")
