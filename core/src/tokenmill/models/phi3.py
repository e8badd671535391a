"""Phi3ForCausalLM: Llama's decoder from checkpoints with fused ``qkv_proj`` / ``gate_up_proj``.

The fused tensors load whole into tokenmill's fused layers; partial rotary embeddings, LongRoPE
scaling, and a sliding window on every layer when ``sliding_window`` is set.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext, ModelBuildContext
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.layers.longrope import build_longrope
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryEmbedding, build_rotary, rope_parameters
from tokenmill.models.llama import LlamaDecoderLayer, LlamaForCausalLM, head_size


def phi3_rotary(config: Any, device: Any) -> RotaryEmbedding:
    """LongRoPE for "longrope" (and its old names "su" / "yarn" in Phi-3 configs), else the standard table."""
    if rope_parameters(config)["rope_type"] in ("longrope", "su", "yarn"):
        return build_longrope(config, head_size(config), device=device)
    return build_rotary(config, head_size(config), device=device)


class Phi3Model(nn.Module):
    """Llama's model body with Phi-3's rotary table."""

    def __init__(self, config: Any, build: ModelBuildContext, family: type[LlamaForCausalLM]):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype=build.dtype)
        self.rotary = phi3_rotary(config, build.device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, build, i, family) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=build.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        angles = self.rotary.angles(positions, hidden.dtype)
        for layer in self.layers:
            hidden, residual = layer(angles, hidden, residual, ctx)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 / Phi-3.5 / Phi-4-mini text models: no biases, silu MLP."""

    @classmethod
    def qkv_bias(cls, config: Any) -> bool:
        return False

    @classmethod
    def o_bias(cls, config: Any) -> bool:
        return False

    def __init__(self, hf_config: Any, build: ModelBuildContext):
        nn.Module.__init__(self)
        self.config = hf_config
        self.model = Phi3Model(hf_config, build, type(self))
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        tied_to = self.model.embed_tokens if self.tie_word_embeddings else None
        self.lm_head = build.lm_head(hf_config.vocab_size, hf_config.hidden_size, tied_to=tied_to)
