"""The GPTQ reference kernel: unpack, dequantize (through ``g_idx``) and matmul, a tile of output
columns at a time so the temporary float weights stay bounded."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import QuantKernel
from tokenmill.plugin_api.tiled_matmul import TILE_ELEMENTS, tile_rows, tiled_matmul
from tokenmill_quant_gptq.dequantize import dequantize_columns


class GPTQTorchKernel(QuantKernel):
    """Plain PyTorch on any device: the correctness oracle for faster GPTQ kernels."""

    name = "gptq-torch"
    tile_elements: ClassVar[int] = TILE_ELEMENTS

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W + bias`` with ``W`` dequantized tile by tile."""
        config = layer.gptq_config
        tile = tile_rows(layer.g_idx.shape[0], 32, self.tile_elements)  # zero words start on whole 32-value runs

        def weight_rows(first: int, end: int, dtype: torch.dtype) -> torch.Tensor:
            return dequantize_columns(layer, config.bits, config.zero_offset, first, end, dtype).T

        return tiled_matmul(x, layer.scales.shape[1], tile, weight_rows, bias)
