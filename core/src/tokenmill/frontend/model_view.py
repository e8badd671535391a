"""The front end's view of the model: limits and defaults from the engine's READY message, and its tokenizer."""

from __future__ import annotations

from typing import Any

from tokenmill.config import EngineArgs, ModelConfig
from tokenmill.tokenizer import TokenizerLoadError, load_tokenizer
from tokenmill.wire import EngineCoreReady


def front_end_model_config(ready: EngineCoreReady) -> ModelConfig:
    """The ModelConfig as the front end sees it: limits and defaults, no HF config (it stays in the engine)."""
    return ModelConfig(
        path=ready.model_path, tokenizer_path=ready.tokenizer_path, architecture=ready.architecture, hf_config=None,
        dtype=ready.dtype, max_model_len=ready.max_model_len, vocab_size=ready.vocab_size,
        eos_token_ids=tuple(ready.eos_token_ids), generation_defaults=dict(ready.generation_defaults),
        served_model_name=ready.served_model_name, quantization=ready.quantization, chat_template=ready.chat_template)


def load_tokenizer_or_none(args: EngineArgs) -> Any | None:
    """The tokenizer at the model (or --tokenizer) path, or None when the folder has none (e.g. a GGUF)."""
    try:
        return load_tokenizer(args.tokenizer or args.model)
    except TokenizerLoadError:
        return None


def tokenizer_from_resolved_config(args: EngineArgs) -> Any:
    """The tokenizer a quantization format supplies from its checkpoint (needs the full resolution)."""
    from tokenmill.engine_core.config_resolver import resolve_config
    from tokenmill.frontend.llm_engine import load_model_tokenizer

    return load_model_tokenizer(resolve_config(args))
