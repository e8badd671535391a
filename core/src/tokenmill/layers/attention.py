"""Attention: the model-side attention layer; the math belongs to the step's attention backend."""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext
from tokenmill.plugin_api import AttentionSpec


class Attention(nn.Module):
    """Paged attention of layer ``layer_index``: writes this step's keys and values into the
    layer's cache and attends, through ``ctx.backend``."""

    def __init__(self, spec: AttentionSpec, layer_index: int):
        super().__init__()
        self.spec = spec
        self.layer_index = layer_index

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                ctx: AttentionContext) -> torch.Tensor:
        """``query`` [T, num_heads, head_size], ``key``/``value`` [T, num_kv_heads, head_size]
        -> [T, num_heads * head_size]."""
        out = ctx.backend.forward(self.spec, query, key, value, ctx.kv_caches[self.layer_index], ctx.metadata)
        return out.reshape(out.shape[0], -1)

    def extra_repr(self) -> str:
        s = self.spec
        extra = f", sliding_window={s.sliding_window}" if s.sliding_window else ""
        heads = f"heads={s.num_heads}, kv_heads={s.num_kv_heads}, head_size={s.head_size}"
        return f"layer={self.layer_index}, {heads}{extra}"
