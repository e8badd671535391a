"""The reference kernel for compressed-tensors ``pack-quantized`` layers: unpack a tile of output
rows, dequantize ``(q - zero_point) * scale`` and multiply."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import QuantKernel
from tokenmill.plugin_api.tiled_matmul import TILE_ELEMENTS, tile_rows, tiled_matmul
from tokenmill_quant_gptq.bitpack import packed_length, unpack_bits


def dequantize_rows(layer: Any, in_features: int, first: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """Weights ``[end - first, in_features]`` of output rows ``first:end`` (``first`` a multiple of 32)."""
    bits = layer.ct_scheme.bits
    offset = 1 << (bits - 1)
    q = unpack_bits(layer.weight_packed[first:end], bits, dim=1, count=in_features) - offset
    groups = _groups(layer, in_features)
    values = q.to(dtype)
    if "weight_zero_point" in layer._parameters:
        words = layer.weight_zero_point[first * bits // 32 : packed_length(end, bits)]
        zero_point = unpack_bits(words, bits, dim=0, count=end - first) - offset
        values = values - zero_point[:, groups].to(dtype)
    return values * layer.weight_scale[first:end, groups].to(dtype)


def _groups(layer: Any, in_features: int) -> torch.Tensor:
    if "weight_g_idx" in layer._parameters:
        return layer.weight_g_idx.long()
    return torch.arange(in_features, device=layer.weight_packed.device) // layer.ct_group_size


class CompressedTensorsPackTorchKernel(QuantKernel):
    """Plain PyTorch on any device, a tile of output rows at a time."""

    name = "compressed-tensors-pack-torch"
    tile_elements: ClassVar[int] = TILE_ELEMENTS

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias``."""
        in_features = x.shape[-1]
        tile = tile_rows(in_features, 32, self.tile_elements)  # zero-point words start on 32-row runs
        return tiled_matmul(x, layer.weight_packed.shape[0], tile,
                            lambda first, end, dtype: dequantize_rows(layer, in_features, first, end, dtype), bias)
