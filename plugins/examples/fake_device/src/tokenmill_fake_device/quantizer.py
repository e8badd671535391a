"""FakeInt8Quantizer: the quantization-format half of the example plugin.

"fakeint8" checkpoints store each linear layer as ``weight`` (int8 [out, in]) and ``weight_scale``
(float32 [out]): symmetric, weight-only, one scale per output channel, so ``W ~= weight * scale[:, None]``.
A checkpoint says so in config.json: ``"quantization_config": {"quant_method": "fakeint8"}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenmill.plugin_api import LinearSpec, Quantizer, QuantKernel
from tokenmill_fake_device.kernels import FakeInt8ReferenceKernel, FakeInt8ScaledMMKernel

QUANT_METHOD = "fakeint8"


def quantize_per_channel(weight: Any) -> tuple[Any, Any]:
    """Full-precision ``weight`` [out, in] -> (int8 weight, float32 scale [out]), the way a
    fakeint8 checkpoint is produced."""
    import torch

    scale = weight.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
    quantized = torch.round(weight.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return quantized, scale


class FakeInt8Quantizer(Quantizer):
    """int8 weights with per-output-channel float32 scales."""

    name = QUANT_METHOD
    api_version = (2, 0)

    @classmethod
    def detect(cls, hf_config: Mapping[str, Any], model_path: str) -> float:
        """Certain when config.json names our method; otherwise not ours. Reads only the config."""
        quantization_config = hf_config.get("quantization_config") or {}
        return 1.0 if quantization_config.get("quant_method") == QUANT_METHOD else 0.0

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """Best first; the reference kernel last (it is also the testkit's oracle)."""
        return (FakeInt8ScaledMMKernel, FakeInt8ReferenceKernel)

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """``weight`` int8 [out, in] and ``weight_scale`` float32 [out], named as in the checkpoint.

        Invariant: both carry ``output_dim = 0``, so the loader can place the q/k/v (or gate/up)
        shards of a fused layer one after another along dimension 0.
        """
        import torch

        weight = torch.nn.Parameter(torch.empty(spec.out_features, spec.in_features, dtype=torch.int8),
                                    requires_grad=False)
        scale = torch.nn.Parameter(torch.empty(spec.out_features, dtype=torch.float32), requires_grad=False)
        weight.output_dim = 0
        scale.output_dim = 0
        layer.register_parameter("weight", weight)
        layer.register_parameter("weight_scale", scale)

    def describe(self) -> str:
        """One line for the startup report."""
        return "fakeint8 (int8 weights, one float32 scale per output channel)"
