"""MixtralForCausalLM: Mistral attention and a sparse MoE block (``block_sparse_moe``) on every layer.

``num_local_experts`` experts named w1 (gate), w3 (up), w2 (down); top-k weights always renormalised.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tokenmill.models.sparse_moe import MoeForCausalLM


class MixtralForCausalLM(MoeForCausalLM):
    """Mixtral 8x7B / 8x22B layout; a sliding window on every layer when ``sliding_window`` is set."""

    moe_prefix: ClassVar[str] = "block_sparse_moe"
    expert_parts: ClassVar[dict[str, str]] = {"w1": "gate", "w3": "up", "w2": "down"}
    float32_routing_weights: ClassVar[bool] = True

    @classmethod
    def num_experts(cls, config: Any) -> int:
        return config.num_local_experts

    @classmethod
    def expert_inner_size(cls, config: Any) -> int:
        return config.intermediate_size

    @classmethod
    def renormalize(cls, config: Any) -> bool:
        return True

    @classmethod
    def is_sparse_layer(cls, config: Any, layer_index: int) -> bool:
        return True
