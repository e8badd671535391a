"""Qwen3MoeForCausalLM: Qwen3 attention (per-head q/k RMSNorm) and sparse MoE blocks, no shared expert."""

from __future__ import annotations

from typing import Any, ClassVar

from tokenmill.models.sparse_moe import MoeForCausalLM


class Qwen3MoeForCausalLM(MoeForCausalLM):
    """Qwen3-30B-A3B / 235B-A22B layout: top-k weights renormalised when ``norm_topk_prob``; a
    sliding window on every layer when ``use_sliding_window`` is set."""

    qk_norm: ClassVar[bool] = True

    @classmethod
    def sliding_window(cls, config: Any, layer_index: int) -> int | None:
        if getattr(config, "use_sliding_window", False) is False:
            return None
        return getattr(config, "sliding_window", None)
