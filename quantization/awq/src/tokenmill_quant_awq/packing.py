"""AWQ's 4-bit packing (the GEMM layout): eight values of consecutive output columns per int32,
interleaved. Nibble ``i`` (bits ``4i .. 4i+3``) of a word holds column ``PACK_ORDER[i]`` of its
group of eight, so the columns come back in order by reading nibbles ``UNPACK_ORDER``."""

from __future__ import annotations

import torch

PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i <- column PACK_ORDER[i]
UNPACK_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column c <- nibble UNPACK_ORDER[c]
BITS = 4
PER_WORD = 8


def unpack_int4(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., n]`` -> int32 values ``[..., 8 n]`` in column order."""
    if words.dtype != torch.int32:
        raise TypeError(f"AWQ packed tensors are int32, got {words.dtype}")
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32, device=words.device)
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF
    order = torch.tensor(UNPACK_ORDER, device=words.device)
    return nibbles.index_select(-1, order).reshape(*words.shape[:-1], words.shape[-1] * PER_WORD)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Values in [0, 15] ``[..., 8 n]`` -> int32 ``[..., n]`` (the inverse of ``unpack_int4``)."""
    if values.shape[-1] % PER_WORD:
        raise ValueError(f"AWQ packs columns in groups of 8, got {values.shape[-1]}")
    if values.numel() and (int(values.min()) < 0 or int(values.max()) > 15):
        raise ValueError("AWQ values must lie in [0, 15]")
    grouped = values.to(torch.int64).reshape(*values.shape[:-1], -1, PER_WORD)
    order = torch.tensor(PACK_ORDER, device=values.device)
    shifts = torch.arange(0, 32, BITS, dtype=torch.int64, device=values.device)
    words = (grouped.index_select(-1, order) << shifts).sum(-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
