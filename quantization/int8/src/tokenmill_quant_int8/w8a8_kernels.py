"""W8A8 int8 kernels: activations quantized per token at run time (symmetric), an exact integer
product ``acc = q_x @ q_w.T``, then ``y = acc * scale_x * scale_w``.

``Int8IntMMKernel`` computes ``acc`` with ``torch._int_mm`` where the platform reports int8 dot
products; ``Int8W8A8TorchKernel`` computes the same integers on any device by float32 matmuls over
chunks of 1024 inputs, whose partial sums (at most 1024 * 127 * 127 < 2**24) float32 holds exactly,
summed in int64. Both then scale identically, so their outputs are bitwise equal.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill_quant_int8.quantize import quantize_per_token

EXACT_CHUNK = 1024  # inputs per float32 partial product that stays exact


def exact_int_product(q_x: torch.Tensor, q_w: torch.Tensor) -> torch.Tensor:
    """``q_x @ q_w.T`` of int8 matrices as exact int64, using only float32 matmuls."""
    acc = torch.zeros(q_x.shape[0], q_w.shape[0], dtype=torch.int64, device=q_x.device)
    for start in range(0, q_x.shape[1], EXACT_CHUNK):
        chunk = slice(start, start + EXACT_CHUNK)
        acc += (q_x[:, chunk].to(torch.float32) @ q_w[:, chunk].to(torch.float32).T).to(torch.int64)
    return acc


def _rescale(acc: torch.Tensor, scale_x: torch.Tensor, layer: Any, x: torch.Tensor, bias: torch.Tensor | None):
    out = (acc.to(torch.float32) * scale_x * layer.weight_scale.reshape(1, -1)).to(x.dtype)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


class Int8W8A8TorchKernel(QuantKernel):
    """W8A8 on any device by exact integer emulation: the correctness oracle for int8 GEMMs."""

    name = "int8-w8a8-torch"

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Only for W8A8 checkpoints."""
        if getattr(quantizer, "scheme", None) is not None and not quantizer.scheme.w8a8:
            return "the checkpoint is weight-only (W8A16)"
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Quantize ``x`` per token, multiply exactly, rescale."""
        q_x, scale_x = quantize_per_token(x.reshape(-1, x.shape[-1]))
        return _rescale(exact_int_product(q_x, layer.weight), scale_x, layer, x, bias)


class Int8IntMMKernel(Int8W8A8TorchKernel):
    """W8A8 with ``torch._int_mm`` (int8 x int8 -> int32) where the platform has int8 dot products."""

    name = "int8-int-mm"
    min_rows: ClassVar[int] = 17  # torch._int_mm on CUDA needs more than 16 rows; fewer are zero-padded

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Needs a W8A8 checkpoint, ``capabilities.int8_dot`` and dimensions divisible by 8."""
        reason = super().supports(quantizer, spec, device_type, caps)
        if reason:
            return reason
        if not caps.int8_dot:
            return "the platform reports no int8 dot products (capabilities.int8_dot is false)"
        if spec.in_features % 8 or spec.out_features % 8:
            return f"torch._int_mm needs dimensions divisible by 8, got {spec.in_features} -> {spec.out_features}"
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Quantize ``x`` per token, ``torch._int_mm``, rescale."""
        q_x, scale_x = quantize_per_token(x.reshape(-1, x.shape[-1]))
        rows = q_x.shape[0]
        if rows < self.min_rows:
            q_x = torch.nn.functional.pad(q_x, (0, 0, 0, self.min_rows - rows))
        acc = torch._int_mm(q_x, layer.weight.t())[:rows]
        return _rescale(acc, scale_x, layer, x, bias)
