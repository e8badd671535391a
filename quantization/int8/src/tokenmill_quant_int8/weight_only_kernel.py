"""The W8A16 reference kernel: dequantize a tile of int8 rows to the compute dtype and multiply."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill.plugin_api.tiled_matmul import TILE_ELEMENTS, tile_rows, tiled_matmul


class Int8WeightOnlyTorchKernel(QuantKernel):
    """Weight-only int8 (W8A16) in plain PyTorch, on any device."""

    name = "int8-w8a16-torch"
    tile_elements: ClassVar[int] = TILE_ELEMENTS

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Only for weight-only checkpoints: a W8A8 one is defined by its activation quantization."""
        if getattr(quantizer, "scheme", None) is not None and quantizer.scheme.w8a8:
            return "the checkpoint is W8A8; this kernel does not quantize activations"
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ (weight * weight_scale).T + bias``."""
        out_features, in_features = layer.weight.shape

        def weight_rows(first: int, end: int, dtype: torch.dtype) -> torch.Tensor:
            return (layer.weight[first:end].to(torch.float32) * layer.weight_scale[first:end]).to(dtype)

        return tiled_matmul(x, out_features, tile_rows(in_features, 1, self.tile_elements), weight_rows, bias)
