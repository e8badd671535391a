"""SiluAndMul: the gated activation of Llama-style MLPs."""

from __future__ import annotations

import torch
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` for a fused input ``[..., 2 * d]`` laid out as ``(gate, up)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return nn.functional.silu(gate) * up
