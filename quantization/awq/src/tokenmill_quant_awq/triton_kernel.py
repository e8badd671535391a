"""``awq-triton``: AWQ layers run by a Triton kernel that dequantizes inside the matmul (see
``triton_matmul``), on every device Triton compiles for. Importing this module does not import
triton; the kernel is compiled (or, under ``TRITON_INTERPRET=1``, interpreted) on first use."""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill.plugin_api.triton import tile_kernel_unavailable


class AWQTritonKernel(QuantKernel):
    """4-bit AWQ (GEMM layout, any group size) in one Triton kernel: packed weights stay in memory
    as they are loaded."""

    name = "awq-triton"

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Needs a device Triton compiles for and a float compute dtype."""
        return tile_kernel_unavailable(device_type, caps, spec.dtype)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W + bias`` in one kernel launch."""
        from tokenmill_quant_awq.triton_matmul import awq_matmul

        rows = x.reshape(-1, x.shape[-1])
        out = awq_matmul(rows, layer.qweight, layer.qzeros, layer.scales, layer.awq_group_size)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
