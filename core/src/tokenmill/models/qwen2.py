"""Qwen2ForCausalLM: Llama with q/k/v biases and an optional sliding window on the upper layers."""

from __future__ import annotations

from typing import Any

from tokenmill.models.llama import LlamaForCausalLM, layer_sliding_window


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Biases on q/k/v (never on o); a sliding window only when ``use_sliding_window`` is set, on
    the layers ``layer_types`` marks (older configs: layers from ``max_window_layers`` up)."""

    @classmethod
    def qkv_bias(cls, config: Any) -> bool:
        return True

    @classmethod
    def o_bias(cls, config: Any) -> bool:
        return False

    @classmethod
    def sliding_window(cls, config: Any, layer_index: int) -> int | None:
        if not getattr(config, "use_sliding_window", False):
            return None
        if getattr(config, "layer_types", None) is not None:
            return layer_sliding_window(config, layer_index)
        return config.sliding_window if layer_index >= config.max_window_layers else None
