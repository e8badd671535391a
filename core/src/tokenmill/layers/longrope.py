"""LongRoPE ("su") rotary tables, as Phi-3 and Phi-3.5 use them for long contexts.

Hugging Face rescales the frequencies by ``short_factor`` while a sequence is within
``original_max_position_embeddings`` and by ``long_factor`` once it is longer, recomputing every
position of the sequence with the long factors at that moment. A paged KV cache cannot rewrite
keys it already holds, so here each position keeps the factors of its own range: positions below
the original length use ``short_factor``, later ones ``long_factor`` (vLLM's choice). Up to the
original length the two agree exactly; beyond it the keys of the early positions differ.
Both ranges are multiplied by the attention factor, as in Hugging Face.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tokenmill.layers.rotary import RotaryEmbedding, rope_parameters


def longrope_attention_factor(params: dict[str, Any], max_positions: int, original_max: int) -> float:
    """``attention_factor`` when the config sets it, else ``sqrt(1 + ln(factor) / ln(original))``."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = params.get("factor") or max_positions / original_max
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original_max))


def build_longrope(hf_config: Any, head_size: int, device: torch.device | str | None = None) -> RotaryEmbedding:
    """The rotary table of a "longrope" config, up to ``max_position_embeddings``."""
    params = rope_parameters(hf_config)
    rotary_dim = int(head_size * params.get("partial_rotary_factor", 1.0))
    original_max = params.get("original_max_position_embeddings") or hf_config.original_max_position_embeddings
    max_positions = hf_config.max_position_embeddings
    for name in ("short_factor", "long_factor"):
        if len(params[name]) != rotary_dim // 2:
            raise ValueError(f"longrope {name} has {len(params[name])} entries; the rotary dimension "
                             f"{rotary_dim} needs {rotary_dim // 2}")
    scale = longrope_attention_factor(params, max_positions, original_max)
    with torch.device("cpu"):
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        base = params["rope_theta"] ** exponents
        short = 1.0 / (torch.tensor(params["short_factor"], dtype=torch.float32) * base)
        long = 1.0 / (torch.tensor(params["long_factor"], dtype=torch.float32) * base)
        positions = torch.arange(max(max_positions, original_max), dtype=torch.int64)[:, None].float()
        freqs = torch.where(positions < original_max, positions * short, positions * long)
        cos, sin = freqs.cos() * scale, freqs.sin() * scale
    return RotaryEmbedding(head_size, rotary_dim, cos.to(device), sin.to(device))
