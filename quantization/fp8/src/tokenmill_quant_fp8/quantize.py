"""Quantization of float weights to fp8 e4m3 with per-tensor, per-channel or block scales: for
``tokenmill quantize`` and tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


@dataclass(frozen=True)
class FP8Tensors:
    """One layer's fp8 weight and scale, and the float weights they encode."""

    weight: torch.Tensor  # float8_e4m3fn [out, in]
    scale: torch.Tensor  # float32: [] per tensor, [out, 1] per channel, [out / bo, in / bi] per block
    dequantized: torch.Tensor  # float32 [out, in]

    def state_dict(self, prefix: str, scale_name: str = "weight_scale") -> dict[str, torch.Tensor]:
        """The tensors under checkpoint names ``<prefix>.weight`` and ``<prefix>.<scale_name>``."""
        return {f"{prefix}.weight": self.weight, f"{prefix}.{scale_name}": self.scale}


def quantize_fp8(weight: torch.Tensor, granularity: str = "tensor", block: tuple[int, int] = (128, 128)) -> FP8Tensors:
    """Quantize ``weight`` [out, in]; ``granularity`` is "tensor", "channel" or "block"."""
    w = weight.detach().to(torch.float32)
    out_features, in_features = w.shape
    if granularity == "tensor":
        scale = w.abs().amax().clamp(min=1e-12) / E4M3_MAX
        expanded = scale.expand_as(w)
    elif granularity == "channel":
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
        expanded = scale.expand_as(w)
    elif granularity == "block":
        rows, cols = block
        padded = torch.nn.functional.pad(w, (0, -in_features % cols, 0, -out_features % rows))
        tiles = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
        scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
        expanded = scale.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[:out_features, :in_features]
    else:
        raise ValueError(f"granularity {granularity!r} is not one of tensor, channel, block")
    q = (w / expanded).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return FP8Tensors(weight=q, scale=scale, dequantized=q.to(torch.float32) * expanded)
