"""GGUF tensor names (llama.cpp's ``blk.N.attn_q.weight``) to Hugging Face parameter names and back."""

from __future__ import annotations

import re

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")

_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_PER_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

# Gemma 2/3 have four norms per layer; llama.cpp's ffn_norm is their pre-feed-forward norm.
_GEMMA_PER_LAYER = {
    **_PER_LAYER,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

# Tensors llama.cpp stores that are not model parameters (derived from config on the HF side).
_IGNORED = {"rope_freqs", "rope_factors_long", "rope_factors_short"}

_LAYER_NAME = re.compile(r"blk\.(\d+)\.([a-z0-9_]+)\.(weight|bias)")
_GLOBAL_NAME = re.compile(r"([a-z0-9_]+)\.(weight|bias)")


def hf_name(gguf_name: str, architecture: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for tensors that are not parameters.

    Raises ValueError for a tensor name the architecture does not have.
    """
    per_layer = _GEMMA_PER_LAYER if architecture.startswith("gemma") else _PER_LAYER
    if m := _LAYER_NAME.fullmatch(gguf_name):
        layer, stem, suffix = m.groups()
        if stem in per_layer:
            return f"model.layers.{layer}.{per_layer[stem]}.{suffix}"
    elif m := _GLOBAL_NAME.fullmatch(gguf_name):
        stem, suffix = m.groups()
        if stem in _IGNORED:
            return None
        if stem in _GLOBAL:
            return f"{_GLOBAL[stem]}.{suffix}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart for architecture {architecture!r}")


def gguf_name(hf: str, architecture: str) -> str | None:
    """The GGUF name of a Hugging Face parameter name, or None when the architecture has none."""
    per_layer = _GEMMA_PER_LAYER if architecture.startswith("gemma") else _PER_LAYER
    module, _, suffix = hf.rpartition(".")
    for stem, hf_module in _GLOBAL.items():
        if module == hf_module:
            return f"{stem}.{suffix}"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", module)
    if m:
        for stem, hf_module in per_layer.items():
            if m.group(2) == hf_module:
                return f"blk.{m.group(1)}.{stem}.{suffix}"
    return None


def stem(gguf_tensor: str) -> str:
    """The tensor's kind without layer index and suffix: ``blk.3.attn_q.weight`` -> ``attn_q``."""
    if m := _LAYER_NAME.fullmatch(gguf_tensor):
        return m.group(2)
    return gguf_tensor.rpartition(".")[0]
