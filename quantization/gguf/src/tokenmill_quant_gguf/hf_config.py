"""The transformers config of a GGUF file, derived from its metadata with transformers' own key
tables (``GGUF_CONFIG_MAPPING``), the way ``load_gguf_checkpoint`` derives it, but from the metadata
tokenmill already parsed (transformers' reader re-parses the whole vocabulary, seconds per call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenmill_quant_gguf.gguf_file import GGUFFile

CAUSAL_LM_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


def hf_config_from_gguf(file: GGUFFile) -> dict[str, Any]:
    """A config.json-style dict (with ``model_type`` and ``architectures``) for ``file``.

    Differences from transformers: ``head_dim`` also comes from ``<arch>.attention.key_length``
    when the architecture's table lacks it (qwen3), and Mistral files (architecture ``llama`` in
    GGUF) load as llama, which they are apart from config defaults.
    """
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    meta = file.metadata
    architecture = meta.get("general.architecture")
    table: Mapping[str, Any] | None = GGUF_CONFIG_MAPPING.get(architecture)
    if table is None:
        raise ValueError(f"{file.path}: transformers has no config mapping for GGUF architecture {architecture!r}")
    config: dict[str, Any] = {"model_type": architecture}
    config["tie_word_embeddings"] = "output.weight" not in file.tensors
    config.update(GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture, {}))
    tokenizer_table = GGUF_CONFIG_MAPPING.get("tokenizer", {})
    for key, value in meta.items():
        prefix, _, rest = key.partition(".")
        if prefix == architecture:
            target = table.get(rest)
        elif prefix == "tokenizer":
            target = tokenizer_table.get(rest)
        else:
            continue
        if target is None or target == -1:
            continue
        config[target] = value[0] if isinstance(value, list) and len(value) == 1 else value
    key_length = meta.get(f"{architecture}.attention.key_length")
    if "head_dim" not in config and isinstance(key_length, int):
        config["head_dim"] = key_length
    if "vocab_size" not in config and isinstance(meta.get("tokenizer.ggml.tokens"), list):
        config["vocab_size"] = len(meta["tokenizer.ggml.tokens"])
    if config["model_type"] == "gemma3":
        config["model_type"] = "gemma3_text"  # a GGUF holds only the text backbone
    model_type = config["model_type"]
    if model_type not in CAUSAL_LM_CLASSES:
        raise ValueError(f"{file.path}: GGUF model type {model_type!r} is not supported")
    config["architectures"] = [CAUSAL_LM_CLASSES[model_type]]
    return config
