"""Kernels for fakeint8 layers: a fast one and the reference one."""

from __future__ import annotations

from typing import Any

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel

FAMILY = "fakedev"


class FakeInt8ScaledMMKernel(QuantKernel):
    """``(x @ weight.T) * scale``: the int8 values are exact in bf16/fp16/fp32, and a per-output-
    channel scale commutes with the matmul, so it is applied once to the output instead of to
    every weight. Gated on the platform's "fakedev" family, as a vendor's device kernel is: the
    conformance test names it in ``required_kernels`` so that a closed gate fails instead of skipping."""

    name = "fakeint8-scaled-mm"

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str,
                 caps: PlatformCapabilities) -> str | None:
        """Runs only where the platform declares the "fakedev" family."""
        return None if FAMILY in caps.families else f"needs a platform of the '{FAMILY}' family"

    def apply(self, layer: Any, x: Any, bias: Any | None) -> Any:
        """Matmul in the activation dtype, then scale (and bias) per output channel."""
        import torch

        out = torch.nn.functional.linear(x, layer.weight.to(x.dtype)) * layer.weight_scale.to(x.dtype)
        return out if bias is None else out + bias


class FakeInt8ReferenceKernel(QuantKernel):
    """Dequantize to float32 and multiply: slow, obviously right, runs anywhere torch does."""

    name = "fakeint8-reference"

    def apply(self, layer: Any, x: Any, bias: Any | None) -> Any:
        """``x @ (weight * scale).T + bias`` in float32, returned in the activation dtype."""
        import torch

        weight = layer.weight.float() * layer.weight_scale.float()[:, None]
        bias32 = None if bias is None else bias.float()
        return torch.nn.functional.linear(x.float(), weight, bias32).to(x.dtype)
