"""``awq-triton``: AWQ layers run by a Triton kernel that dequantizes inside the matmul (see
``triton_matmul``), on every device Triton compiles for. Importing this module does not import
triton; the kernel is compiled (or, under ``TRITON_INTERPRET=1``, interpreted) on first use."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel

TRITON_DEVICE_TYPES = ("cuda", "xpu")
CPU_REASON = "on the CPU Triton runs only as its slow interpreter (TRITON_INTERPRET=1, for tests), not for serving"
DTYPES = ("float32", "float16", "bfloat16")


def triton_unavailable(device_type: str, caps: PlatformCapabilities) -> str | None:
    """Why Triton cannot compile for ``device_type`` here, or None when it can."""
    if device_type == "cpu":
        return CPU_REASON
    if device_type not in TRITON_DEVICE_TYPES and "triton" not in caps.families:
        return f"Triton has no backend for {device_type!r} devices (cuda, xpu, or a platform of the 'triton' family)"
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (pip install 'triton>=3.0')"
    return None


class AWQTritonKernel(QuantKernel):
    """4-bit AWQ (GEMM layout, any group size) in one Triton kernel: packed weights stay in memory
    as they are loaded."""

    name = "awq-triton"

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Needs a device Triton compiles for and a float compute dtype."""
        reason = triton_unavailable(device_type, caps)
        if reason is not None:
            return reason
        if spec.dtype not in DTYPES:
            return f"compute dtype {spec.dtype} is not one of {', '.join(DTYPES)}"
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W + bias`` in one kernel launch."""
        from tokenmill_quant_awq.triton_matmul import awq_matmul

        rows = x.reshape(-1, x.shape[-1])
        out = awq_matmul(rows, layer.qweight, layer.qzeros, layer.scales, layer.awq_group_size)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
