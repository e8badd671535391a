"""W8A8 fp8 kernels: activations quantized per token at run time (dynamic, symmetric), then
``torch._scaled_mm`` multiplies fp8 by fp8 with row-wise scales on both sides.

Offered only where the platform says it computes in fp8 (``capabilities.fp8_compute``). Platforms
whose hardware uses ``e4m3fnuz`` (AMD MI300) get the weights re-encoded once after loading: the same
bits mean half the value in e4m3fnuz, so the scales double, and e4m3fn's negative zero (NaN in
e4m3fnuz) becomes zero. A checkpoint's static ``input_scale`` is not used: per-token scales are at
least as accurate.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import Fp8Format, LinearSpec, PlatformCapabilities, Quantizer, QuantKernel


def quantize_per_token(rows: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 rows, float32 scales [rows, 1]) with ``rows ~= q * scale``, each row scaled to fp8's range."""
    fmax = torch.finfo(fp8_dtype).max
    scale = rows.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=1e-12) / fmax
    return (rows.to(torch.float32) / scale).clamp(-fmax, fmax).to(fp8_dtype), scale


class FP8ScaledMMKernel(QuantKernel):
    """fp8 x fp8 matmul with dynamic per-token activation scales (OCP e4m3fn hardware)."""

    name = "fp8-scaled-mm"
    fp8_format: ClassVar[Fp8Format] = Fp8Format.OCP
    fp8_dtype: ClassVar[torch.dtype] = torch.float8_e4m3fn

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Needs native fp8 matmul in this kernel's fp8 encoding, per-tensor or per-channel weight
        scales, and dimensions that are multiples of 16."""
        if not caps.fp8_compute:
            return "the platform has no native fp8 matmul (capabilities.fp8_compute is false)"
        if caps.fp8_format != cls.fp8_format:
            return f"the platform computes fp8 as {caps.fp8_format.value}, this kernel as {cls.fp8_format.value}"
        if getattr(quantizer, "scheme", None) is not None and quantizer.scheme.block is not None:
            return "block-wise weight scales need a block-scaled GEMM"
        if spec.in_features % 16 or spec.out_features % 16:
            return f"torch._scaled_mm needs dimensions divisible by 16, got {spec.in_features} -> {spec.out_features}"
        return None

    def process_weights_after_loading(self, layer: Any) -> None:
        """Lay the per-row weight scales out as ``_scaled_mm``'s ``scale_b`` [1, out]."""
        layer.fp8_scale_b = layer.weight_scale.detach().reshape(1, -1).to(torch.float32).contiguous()

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Quantize ``x`` per token, multiply in fp8, rescale to ``x``'s dtype."""
        rows = x.reshape(-1, x.shape[-1])
        q, scale = quantize_per_token(rows, self.fp8_dtype)
        out = torch._scaled_mm(q, layer.weight.t(), scale_a=scale, scale_b=layer.fp8_scale_b,
                               out_dtype=torch.bfloat16).to(x.dtype)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


class FP8ScaledMMFnuzKernel(FP8ScaledMMKernel):
    """The same on e4m3fnuz hardware, after re-encoding the e4m3fn checkpoint weights."""

    name = "fp8-scaled-mm-fnuz"
    fp8_format = Fp8Format.FNUZ
    fp8_dtype = torch.float8_e4m3fnuz

    def process_weights_after_loading(self, layer: Any) -> None:
        """Re-encode ``weight`` as e4m3fnuz (same bits, negative zero cleared) and double the scales."""
        bits = layer.weight.data.view(torch.int8)
        bits = torch.where(bits == -128, torch.zeros_like(bits), bits)
        layer.weight.data = bits.view(torch.float8_e4m3fnuz)
        layer.weight_scale.data = layer.weight_scale.data * 2
        super().process_weights_after_loading(layer)
