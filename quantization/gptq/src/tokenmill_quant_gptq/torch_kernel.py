"""The GPTQ reference kernel: unpack, dequantize (through ``g_idx``) and matmul, a tile of output
columns at a time so the temporary float weights stay bounded."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill_quant_gptq.dequantize import dequantize_columns


class GPTQTorchKernel(QuantKernel):
    """Plain PyTorch on any device: the correctness oracle for faster GPTQ kernels."""

    name = "gptq-torch"
    tile_elements: ClassVar[int] = 1 << 22  # weights dequantized at once

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Runs every layer the format accepts."""
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W + bias`` with ``W`` dequantized tile by tile."""
        config = layer.gptq_config
        in_features, out_features = layer.g_idx.shape[0], layer.scales.shape[1]
        rows = x.reshape(-1, in_features)
        out = rows.new_empty(rows.shape[0], out_features)
        tile = max(32, self.tile_elements // in_features // 32 * 32)  # zero words start on whole 32-value runs
        for first in range(0, out_features, tile):
            end = min(out_features, first + tile)
            weight = dequantize_columns(layer, config.bits, config.zero_offset, first, end, rows.dtype)
            out[:, first:end] = rows @ weight
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out_features)
