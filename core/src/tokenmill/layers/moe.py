"""Mixture-of-experts layers: the top-k router and FusedMoE, experts' gated MLPs stacked ``[E, ...]``.

How the experts run: the (token, expert) assignments are sorted by expert once, the routed token
rows are gathered into one contiguous block, and a Python loop over the *experts that received
tokens* runs one matmul pair per expert on its slice; a single ``index_add_`` scatters the
weighted results back. No Python loop ever runs over tokens. Alternatives and why not:

* a dense ``bmm`` over all experts computes ``num_experts / top_k`` times the needed FLOPs
  (16x for Qwen3-MoE's 128 experts with top-8);
* gathering each assignment's expert weights (``w[ids]`` then ``bmm``) copies a whole expert's
  weights per token, megabytes per row, which dominates small decode batches on a CPU.

The per-expert loop does exactly the routed FLOPs with large, contiguous matmuls; its Python
overhead grows with the number of active experts (at most ``min(num_experts, tokens * top_k)``).

Expert weights stay unquantized full-precision tensors (the checkpoint's quantized expert
formats are not supported yet).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tokenmill.layers.gated_activation import activation
from tokenmill.plugin_api.linear import load_shard

SHARDS = {"gate": 0, "up": 1}


class RouterLinear(nn.Module):
    """A small full-precision projection ``[out, in]`` (expert router, shared-expert gate)."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k] float32, expert ids [T, top_k]): softmax over all experts in float32,
    the ``top_k`` largest, rescaled to sum to one when ``renormalize``."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class FusedMoE(nn.Module):
    """``num_experts`` gated MLPs: ``w13_weight`` [E, 2 * inner, hidden] holds each expert's gate
    rows then its up rows, ``w2_weight`` [E, hidden, inner] its down projection.

    ``float32_weights`` keeps the routing weights in float32 when scaling expert outputs (Mixtral);
    otherwise they are cast to the activation dtype first (Qwen MoE), as each model does.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, inner_size: int, act: str = "silu", *,
                 renormalize: bool = True, float32_weights: bool = False, dtype: torch.dtype | None = None):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.hidden_size, self.inner_size = hidden_size, inner_size
        self.renormalize = renormalize
        self.float32_weights = float32_weights
        self.act_name = act
        self.act = activation(act, "mixture of experts")
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * inner_size, hidden_size, dtype=dtype),
                                       requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, inner_size, dtype=dtype),
                                      requires_grad=False)
        self._loaded: dict[str, set[tuple[int, str]]] = {"w13_weight": set(), "w2_weight": set()}

    def load_expert(self, expert: int, part: str, tensor: torch.Tensor) -> str:
        """Copy one expert's ``part`` ("gate", "up" or "down"; [out, in] as in the checkpoint) into
        the stacked weights; returns the parameter name it went to."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} does not exist (the layer has {self.num_experts})")
        if part == "down":
            load_shard(self.w2_weight[expert], tensor)
            self._loaded["w2_weight"].add((expert, part))
            return "w2_weight"
        rows = self.w13_weight[expert].narrow(0, SHARDS[part] * self.inner_size, self.inner_size)
        load_shard(rows, tensor)
        self._loaded["w13_weight"].add((expert, part))
        return "w13_weight"

    def load_stacked(self, part: str, tensor: torch.Tensor) -> str:
        """Copy an already stacked tensor: "gate_up" [E, 2 * inner, hidden] or "down" [E, hidden, inner]."""
        name = "w13_weight" if part == "gate_up" else "w2_weight"
        load_shard(getattr(self, name), tensor)
        parts = ("gate", "up") if part == "gate_up" else ("down",)
        self._loaded[name].update((e, p) for e in range(self.num_experts) for p in parts)
        return name

    def complete(self) -> set[str]:
        """Names of the stacked parameters every expert has been loaded into."""
        need = {"w13_weight": 2 * self.num_experts, "w2_weight": self.num_experts}
        return {name for name, seen in self._loaded.items() if len(seen) == need[name]}

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``x`` [T, hidden] and ``router_logits`` [T, num_experts] -> [T, hidden]."""
        weights, ids = route(router_logits, self.top_k, self.renormalize)
        if not self.float32_weights:
            weights = weights.to(x.dtype)
        flat_ids = ids.reshape(-1)
        order = flat_ids.argsort(stable=True)
        token_of = order // self.top_k
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        routed = x.index_select(0, token_of)
        outputs = []
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            gate, up = F.linear(routed[start: start + count], self.w13_weight[expert]).chunk(2, dim=-1)
            outputs.append(F.linear(self.act(gate) * up, self.w2_weight[expert]))
            start += count
        scaled = torch.cat(outputs) * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, token_of, scaled.to(x.dtype))

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, inner={self.inner_size}, "
                f"act={self.act_name}, renormalize={self.renormalize}")
