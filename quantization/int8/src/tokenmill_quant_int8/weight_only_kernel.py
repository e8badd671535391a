"""The W8A16 reference kernel: dequantize a tile of int8 rows to the compute dtype and multiply."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel


class Int8WeightOnlyTorchKernel(QuantKernel):
    """Weight-only int8 (W8A16) in plain PyTorch, on any device."""

    name = "int8-w8a16-torch"
    tile_elements: ClassVar[int] = 1 << 22

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Only for weight-only checkpoints: a W8A8 one is defined by its activation quantization."""
        if getattr(quantizer, "scheme", None) is not None and quantizer.scheme.w8a8:
            return "the checkpoint is W8A8; this kernel does not quantize activations"
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ (weight * weight_scale).T + bias``."""
        out_features, in_features = layer.weight.shape
        rows = x.reshape(-1, in_features)
        out = rows.new_empty(rows.shape[0], out_features)
        tile = max(1, self.tile_elements // in_features)
        for first in range(0, out_features, tile):
            end = min(out_features, first + tile)
            weight = (layer.weight[first:end].to(torch.float32) * layer.weight_scale[first:end]).to(rows.dtype)
            out[:, first:end] = rows @ weight.T
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out_features)
