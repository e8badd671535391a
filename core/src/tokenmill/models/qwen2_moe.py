"""Qwen2MoeForCausalLM: Qwen2 attention and sparse MoE blocks with a sigmoid-gated shared expert.

The shared expert's output is scaled by ``sigmoid(shared_expert_gate(x))`` and added to the routed one.
"""

from __future__ import annotations

from typing import Any

from tokenmill.models.qwen2 import Qwen2ForCausalLM
from tokenmill.models.sparse_moe import MoeForCausalLM


class Qwen2MoeForCausalLM(MoeForCausalLM):
    """Qwen1.5-MoE / Qwen2-MoE: ``shared_expert_intermediate_size`` sizes the shared expert; the
    top-k weights are renormalised only when ``norm_topk_prob`` is set."""

    @classmethod
    def qkv_bias(cls, config: Any) -> bool:
        return Qwen2ForCausalLM.qkv_bias(config)

    @classmethod
    def o_bias(cls, config: Any) -> bool:
        return Qwen2ForCausalLM.o_bias(config)

    @classmethod
    def sliding_window(cls, config: Any, layer_index: int) -> int | None:
        return Qwen2ForCausalLM.sliding_window(config, layer_index) or None

    @classmethod
    def shared_expert_inner_size(cls, config: Any) -> int:
        return getattr(config, "shared_expert_intermediate_size", 0) or 0
