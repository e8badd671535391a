"""The AWQ reference kernel: unpack, dequantize ``(q - zero) * scale`` and matmul, a tile of output
columns at a time."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import QuantKernel
from tokenmill.plugin_api.tiled_matmul import TILE_ELEMENTS, tile_rows, tiled_matmul
from tokenmill_quant_awq.packing import PER_WORD, unpack_int4


def dequantize_columns(layer: Any, first: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """Weights ``[in_features, end - first]`` of output columns ``first:end`` (multiples of 8)."""
    words = slice(first // PER_WORD, end // PER_WORD)
    q = unpack_int4(layer.qweight[:, words])
    zeros = unpack_int4(layer.qzeros[:, words])
    groups = torch.arange(q.shape[0], device=q.device) // layer.awq_group_size
    return (q - zeros[groups]).to(dtype) * layer.scales[groups, first:end].to(dtype)


class AWQTorchKernel(QuantKernel):
    """Plain PyTorch on any device: the correctness oracle for faster AWQ kernels."""

    name = "awq-torch"
    tile_elements: ClassVar[int] = TILE_ELEMENTS

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W + bias``, a tile of output columns (whole int32 words) at a time."""
        tile = tile_rows(x.shape[-1], PER_WORD, self.tile_elements)
        return tiled_matmul(x, layer.scales.shape[1], tile,
                            lambda first, end, dtype: dequantize_columns(layer, first, end, dtype).T, bias)
