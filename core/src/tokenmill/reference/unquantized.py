"""Unquantized: full-precision linear layers, the quantization format of last resort.

It claims a checkpoint with a tiny constant confidence, so every real format that recognises the
checkpoint wins, and it computes ``x @ W.T + b`` with ``torch.nn.functional.linear``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, Quantizer, QuantKernel

FALLBACK_CONFIDENCE = 0.01


class TorchLinearKernel(QuantKernel):
    """``torch.nn.functional.linear`` on the layer's full-precision ``weight`` [out, in]."""

    name = "torch-linear"
    plain_weight = True

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ layer.weight.T (+ bias)``."""
        return torch.nn.functional.linear(x, layer.weight, bias)


class Unquantized(Quantizer):
    """Weights stored in the compute dtype, exactly as the checkpoint holds them."""

    name = "unquantized"
    api_version = (2, 0)

    @classmethod
    def detect(cls, hf_config: Mapping[str, Any], model_path: str) -> float:
        """A small constant: the fallback when no format claims the checkpoint."""
        return FALLBACK_CONFIDENCE

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """The torch reference kernel (a platform may offer its own for these plain weights:
        ``Platform.linear_kernels``)."""
        return (TorchLinearKernel,)

    def is_quantized(self, spec: LinearSpec) -> bool:
        """Nothing is stored quantized."""
        return False

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register ``weight`` [out_features, in_features] in the compute dtype, fused shards
        concatenated along dim 0 (``output_dim = 0``)."""
        weight = torch.nn.Parameter(
            torch.empty(spec.out_features, spec.in_features, dtype=getattr(torch, spec.dtype)), requires_grad=False
        )
        weight.output_dim = 0
        layer.register_parameter("weight", weight)

    def describe(self) -> str:
        """The format name; there are no settings."""
        return "unquantized (full-precision weights)"
