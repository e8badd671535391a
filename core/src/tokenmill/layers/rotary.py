"""Rotary position embedding (NeoX layout, as Hugging Face Llama), with cos/sin tables
precomputed once per model up to its maximum position and indexed by each token's position.

Frequencies follow ``transformers.modeling_rope_utils`` exactly for the rope types listed in
``SUPPORTED_ROPE_TYPES``. "dynamic" (NTK) is evaluated per position: the token at position ``p``
uses the base Hugging Face computes for a sequence of ``p + 1`` tokens, which is what it does when
decoding one token at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenmill.plugin_api import LayerKernels

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The config's rope settings as one dict with ``rope_type`` and ``rope_theta``, from either
    the transformers 5 ``rope_parameters`` field or the older ``rope_theta`` + ``rope_scaling``."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, Mapping) and "rope_theta" in params:
        params = dict(params)
    else:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    legacy_type = params.pop("type", None)
    params["rope_type"] = params.get("rope_type") or legacy_type or "default"
    partial = getattr(hf_config, "partial_rotary_factor", None)
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    return params


def _inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(params: Mapping[str, Any], dim: int) -> torch.Tensor:
    inv_freq = _inv_freq(params["rope_theta"], dim)
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _dynamic_ntk_freqs(params: Mapping[str, Any], dim: int, original_max: int, max_position: int) -> torch.Tensor:
    """Per-position angles [max_position, dim / 2] of dynamic NTK scaling."""
    theta, factor = params["rope_theta"], params["factor"]
    positions = torch.arange(max_position, dtype=torch.int64)
    inside = min(original_max, max_position)
    freqs = [positions[:inside, None].float() * _inv_freq(theta, dim)]
    if max_position > original_max:
        seq_len = positions[original_max:] + 1
        base = theta * ((factor * seq_len / original_max) - (factor - 1)) ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        inv_freq = 1.0 / (base[:, None] ** exponents[None, :])
        freqs.append(positions[original_max:, None].float() * inv_freq)
    return torch.cat(freqs)


@dataclass(frozen=True)
class RotaryAngles:
    """cos / sin of one step's positions, looked up once and shared by every layer."""

    cos: torch.Tensor  # [T, 1, rotary_dim / 2] in the activation dtype
    sin: torch.Tensor
    rotary_dim: int
    kernels: LayerKernels | None = None

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [T, heads, head_size] (NeoX halves), leaving features past rotary_dim alone."""
        x1, x2 = x[..., : self.rotary_dim].chunk(2, dim=-1)
        out = torch.cat((x1 * self.cos - x2 * self.sin, x2 * self.cos + x1 * self.sin), dim=-1)
        if self.rotary_dim == x.shape[-1]:
            return out
        return torch.cat((out, x[..., self.rotary_dim :]), dim=-1)

    def apply(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kernels is not None:
            fused = self.kernels.rotary(query, key, self.cos, self.sin)
            if fused is not None:
                return fused
        return self.rotate(query), self.rotate(key)


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of every query and key head by its position.

    ``cos`` / ``sin`` are float32 [max_position, rotary_dim / 2]; they are cast to the activation
    dtype after lookup, as Hugging Face does. ``kernels`` (a platform's LayerKernels, set by
    ``build_model``) may rotate queries and keys in one call.
    """

    kernels: LayerKernels | None = None

    def __init__(self, head_size: int, rotary_dim: int, cos: torch.Tensor, sin: torch.Tensor):
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @property
    def max_position(self) -> int:
        return self.cos.shape[0]

    def angles(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryAngles:
        """The angles of ``positions`` [T] (each below ``max_position``) in ``dtype``."""
        return RotaryAngles(self._lookup(self.cos, positions, dtype), self._lookup(self.sin, positions, dtype),
                            self.rotary_dim, self.kernels)

    def _lookup(self, table: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.kernels is not None and table.dtype == dtype:
            rows = self.kernels.gather_rows(table, positions)
            if rows is not None:
                return rows.unsqueeze(-2)
        return table[positions].to(dtype).unsqueeze(-2)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """Rotate ``query`` [T, H, head_size] and ``key`` [T, KVH, head_size] at ``positions`` [T]."""
        return self.angles(positions, query.dtype).apply(query, key)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, max_position={self.max_position}"


def build_rotary(hf_config: Any, head_size: int, device: torch.device | str | None = None) -> RotaryEmbedding:
    """The RotaryEmbedding a Hugging Face config describes, tables computed on the CPU in float32
    and then moved to ``device``."""
    params = rope_parameters(hf_config)
    rope_type = params["rope_type"]
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    rotary_dim = int(head_size * params.get("partial_rotary_factor", 1.0))
    original_max = hf_config.max_position_embeddings
    max_position = original_max
    if rope_type in ("linear", "dynamic"):
        max_position = int(original_max * params["factor"])

    with torch.device("cpu"):
        if rope_type == "dynamic":
            freqs = _dynamic_ntk_freqs(params, rotary_dim, original_max, max_position)
        else:
            if rope_type == "llama3":
                inv_freq = _llama3_inv_freq(params, rotary_dim)
            else:
                inv_freq = _inv_freq(params["rope_theta"], rotary_dim)
                if rope_type == "linear":
                    inv_freq = inv_freq / params["factor"]
            freqs = torch.arange(max_position, dtype=torch.int64)[:, None].float() * inv_freq
        cos, sin = freqs.cos(), freqs.sin()
    return RotaryEmbedding(head_size, rotary_dim, cos.to(device), sin.to(device))
