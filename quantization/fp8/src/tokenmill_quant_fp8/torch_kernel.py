"""The FP8 reference kernel: weight-only, dequantize a tile of output rows to the compute dtype and
multiply. Runs anywhere torch can convert float8 (every device, no fp8 arithmetic needed)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import QuantKernel
from tokenmill.plugin_api.tiled_matmul import TILE_ELEMENTS, tile_rows, tiled_matmul


def dequantize_rows(layer: Any, first: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """Float weights ``[end - first, in_features]`` of output rows ``first:end``."""
    weight = layer.weight[first:end].to(torch.float32)
    block = layer.fp8_block
    if block is None:
        scale = layer.weight_scale[first:end]
    else:
        rows, cols = block
        scale = getattr(layer, layer.fp8_scale_name)
        row_blocks = torch.arange(first, end, device=scale.device) // rows
        scale = scale[row_blocks].repeat_interleave(cols, dim=1)[:, : weight.shape[1]]
    return (weight * scale).to(dtype)


class FP8TorchKernel(QuantKernel):
    """Weight-only fp8: plain PyTorch, the correctness oracle for the fp8 kernels."""

    name = "fp8-torch"
    tile_elements: ClassVar[int] = TILE_ELEMENTS

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` with ``W`` dequantized a tile of rows at a time."""
        out_features, in_features = layer.weight.shape
        return tiled_matmul(x, out_features, tile_rows(in_features, 1, self.tile_elements),
                            lambda first, end, dtype: dequantize_rows(layer, first, end, dtype), bias)
