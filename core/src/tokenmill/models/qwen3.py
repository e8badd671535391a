"""Qwen3ForCausalLM: Qwen2's sliding-window rules, Llama's ``attention_bias`` flag, and an RMSNorm
over each query and key head before the rotary embedding."""

from __future__ import annotations

from typing import Any, ClassVar

from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.qwen2 import Qwen2ForCausalLM


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    """Per-head q/k norm; biases only when ``attention_bias`` is set."""

    qk_norm: ClassVar[bool] = True

    @classmethod
    def qkv_bias(cls, config: Any) -> bool:
        return LlamaForCausalLM.qkv_bias(config)

    @classmethod
    def o_bias(cls, config: Any) -> bool:
        return LlamaForCausalLM.o_bias(config)
