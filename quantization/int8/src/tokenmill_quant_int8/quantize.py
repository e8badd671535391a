"""Symmetric int8 quantization of weights (per channel or per tensor) and of activations (per
token): for ``tokenmill quantize``, the W8A8 kernels and tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_MAX = 127


@dataclass(frozen=True)
class Int8Tensors:
    """One layer's int8 weight and scale, and the float weights they encode."""

    weight: torch.Tensor  # int8 [out, in]
    scale: torch.Tensor  # float32 [out, 1] per channel, [] per tensor
    dequantized: torch.Tensor  # float32 [out, in]

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under checkpoint names ``<prefix>.weight`` and ``<prefix>.weight_scale``."""
        return {f"{prefix}.weight": self.weight, f"{prefix}.weight_scale": self.scale}


def quantize_int8(weight: torch.Tensor, granularity: str = "channel") -> Int8Tensors:
    """Quantize ``weight`` [out, in] symmetrically; ``granularity`` is "channel" or "tensor"."""
    w = weight.detach().to(torch.float32)
    if granularity == "channel":
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / INT8_MAX
    elif granularity == "tensor":
        scale = w.abs().amax().clamp(min=1e-12) / INT8_MAX
    else:
        raise ValueError(f"granularity {granularity!r} is not one of channel, tensor")
    q = torch.round(w / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Tensors(weight=q, scale=scale, dequantized=q.to(torch.float32) * scale)


def quantize_per_token(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, float32 scales [rows, 1]) with ``rows ~= q * scale``, each row symmetric."""
    scale = rows.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=1e-12) / INT8_MAX
    q = torch.round(rows.to(torch.float32) / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale
