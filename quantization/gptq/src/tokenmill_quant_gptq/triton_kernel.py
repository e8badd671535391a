"""``gptq-triton``: GPTQ layers run by a Triton kernel that dequantizes inside the matmul (see
``triton_matmul``), on every device Triton compiles for. Importing this module does not import
triton; the kernel is compiled (or, under ``TRITON_INTERPRET=1``, interpreted) on first use."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill.plugin_api.triton import tile_kernel_unavailable


class GPTQTritonKernel(QuantKernel):
    """2, 4 and 8-bit GPTQ (any group size, act order, sym or asym, v1 or v2 zeros) in one Triton
    kernel: packed weights stay in memory as they are loaded."""

    name = "gptq-triton"

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Needs a device Triton compiles for, a float compute dtype and a bit width dividing 32."""
        reason = tile_kernel_unavailable(device_type, caps, spec.dtype)
        if reason is not None:
            return reason
        bits = quantizer.config.bits
        if 32 % bits:
            return f"{bits}-bit values straddle int32 words; this kernel handles 2, 4 and 8 bits"
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W + bias`` in one kernel launch."""
        from tokenmill_quant_gptq.triton_matmul import gptq_matmul

        config = layer.gptq_config
        rows = x.reshape(-1, x.shape[-1])
        out = gptq_matmul(rows, layer.qweight, layer.qzeros, layer.scales, layer.g_idx, config.bits, config.zero_offset)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
