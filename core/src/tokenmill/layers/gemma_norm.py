"""GemmaRMSNorm: RMSNorm whose stored weight is an offset from one, computed in float32 throughout."""

from __future__ import annotations

import torch
from torch import nn


class GemmaRMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * (1 + weight)`` over the last dimension.

    Unlike Llama's RMSNorm the product with the weight happens in float32 before the cast back to
    the input dtype (Gemma's checkpoints store ``weight`` centred on zero).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
