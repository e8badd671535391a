"""SiluAndMul: the gated activation of Llama-style MLPs."""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.plugin_api import LayerKernels


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` for a fused input ``[..., 2 * d]`` laid out as ``(gate, up)``; ``kernels`` (a
    platform's LayerKernels, set by ``build_model``) may compute it in one call."""

    kernels: LayerKernels | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            fused = self.kernels.silu_and_mul(x)
            if fused is not None:
                return fused
        gate, up = x.chunk(2, dim=-1)
        return nn.functional.silu(gate) * up
