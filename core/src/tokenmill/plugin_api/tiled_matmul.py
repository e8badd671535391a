"""tiled_matmul: ``x @ W.T + bias`` with the float ``W`` built a tile of output rows at a time, so a
reference kernel's temporary dequantized weights stay bounded however large the layer."""

from __future__ import annotations

from collections.abc import Callable

import torch

TILE_ELEMENTS = 1 << 22
"""Dequantized weight elements a reference kernel holds at once, by default."""


def tile_rows(in_features: int, multiple: int = 1, tile_elements: int = TILE_ELEMENTS) -> int:
    """Output rows per tile: ``tile_elements // in_features`` rounded down to ``multiple`` (packed
    formats whose words span several rows), at least ``multiple``."""
    return max(multiple, tile_elements // in_features // multiple * multiple)


def tiled_matmul(x: torch.Tensor, out_features: int, tile: int,
                 weight_rows: Callable[[int, int, torch.dtype], torch.Tensor],
                 bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [..., in] times ``W.T`` plus ``bias`` -> [..., out_features] in ``x``'s dtype, where
    ``weight_rows(first, end, dtype)`` returns ``W[first:end]`` ([end - first, in]) in ``dtype``;
    ``tile`` output rows are dequantized per call."""
    rows = x.reshape(-1, x.shape[-1])
    out = rows.new_empty(rows.shape[0], out_features)
    for first in range(0, out_features, tile):
        end = min(out_features, first + tile)
        out[:, first:end] = rows @ weight_rows(first, end, rows.dtype).T
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], out_features)
