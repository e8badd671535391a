"""RMSNorm, computed in float32 like Hugging Face's, with an optional fused residual add."""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.plugin_api import LayerKernels


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension.

    ``forward(x)`` returns the normalised ``x``; ``forward(x, residual)`` first adds ``residual``
    (in the input dtype, as the unfused model does) and returns ``(normed, x + residual)``.
    ``kernels`` (a platform's LayerKernels, set by ``build_model``) may compute either in one call.
    """

    kernels: LayerKernels | None = None

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.kernels is not None:
            fused = self.kernels.rms_norm(x, self.weight, self.eps, residual)
            if fused is not None:
                return fused
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
