"""Gemma2ForCausalLM: Gemma 2, and the decoder skeleton Gemma 3 reuses.

What sets Gemma apart from Llama: RMSNorm weights stored as offsets from one (``GemmaRMSNorm``),
embeddings scaled by ``sqrt(hidden_size)``, four norms per layer (before and after attention and
MLP, residual added after the post-norms), a gated tanh-GELU MLP, attention scaled by
``query_pre_attn_scalar ** -0.5`` with optional logits soft-capping, sliding-window and global
layers alternating as ``layer_types`` says, and soft-capped final logits.

Family members differ through the class-level hooks ``qk_norm``, ``rotary_for_layer_type`` and
``attention_soft_cap``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from tokenmill.layers.attention import Attention
from tokenmill.layers.context import AttentionContext, ModelBuildContext
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.layers.gated_activation import GatedActivation
from tokenmill.layers.gemma_norm import GemmaRMSNorm
from tokenmill.layers.pooling import DEFAULT_DECODER_POOLING, PoolingConfig
from tokenmill.layers.rotary import RotaryAngles, RotaryEmbedding, build_rotary
from tokenmill.models.llama import head_size
from tokenmill.models.weight_mapping import load_checkpoint_weights
from tokenmill.plugin_api import AttentionSpec

SLIDING = "sliding_attention"
FULL = "full_attention"


def gemma_layer_types(config: Any, default_pattern: int) -> list[str]:
    """``config.layer_types``, or for older configs every ``sliding_window_pattern``-th layer
    global and the others sliding (Gemma 2's pattern is 2: even layers slide)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return list(layer_types)
    pattern = getattr(config, "sliding_window_pattern", None) or default_pattern
    return [SLIDING if (i + 1) % pattern else FULL for i in range(config.num_hidden_layers)]


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(x / cap)``; ``x`` unchanged when ``cap`` is None or 0."""
    return torch.tanh(x / cap) * cap if cap else x


class GemmaMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused; act from ``hidden_activation``."""

    def __init__(self, config: Any, build: ModelBuildContext, prefix: str):
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "gelu_pytorch_tanh")
        self.gate_up_proj = build.linear(f"{prefix}.gate_up_proj", hidden, (inner, inner), False)
        self.down_proj = build.linear(f"{prefix}.down_proj", inner, (hidden,), False)
        self.act = GatedActivation(act, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class GemmaAttention(nn.Module):
    """Fused q/k/v, optional per-head q/k GemmaRMSNorm, rotary embedding, paged attention with
    Gemma's scale, soft-cap and this layer's window."""

    def __init__(self, config: Any, build: ModelBuildContext, layer_type: str, layer_index: int, prefix: str,
                 family: type[Gemma2ForCausalLM]):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_size = head_size(config)
        self.layer_type = layer_type
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        self.output_sizes = (q_size, kv_size, kv_size)
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = build.linear(f"{prefix}.qkv_proj", config.hidden_size, self.output_sizes, bias)
        self.o_proj = build.linear(f"{prefix}.o_proj", q_size, (config.hidden_size,), bias)
        if family.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps, dtype=build.dtype)
            self.k_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps, dtype=build.dtype)
        window = config.sliding_window if layer_type == SLIDING else None
        spec = build.attention_spec(self.num_heads, self.num_kv_heads, self.head_size,
                                    scale=float(config.query_pre_attn_scalar) ** -0.5, sliding_window=window,
                                    logits_soft_cap=family.attention_soft_cap(config))
        self.attn = Attention(spec, layer_index)

    def forward(self, angles: RotaryAngles, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.output_sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_size)
        k = k.view(-1, self.num_kv_heads, self.head_size)
        v = v.view(-1, self.num_kv_heads, self.head_size)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = angles.apply(q, k)
        return self.o_proj(self.attn(q, k, v, ctx))


class GemmaDecoderLayer(nn.Module):
    """``h += post_attn_norm(attn(input_norm(h)))`` then ``h += post_ff_norm(mlp(pre_ff_norm(h)))``."""

    def __init__(self, config: Any, build: ModelBuildContext, layer_type: str, layer_index: int,
                 family: type[Gemma2ForCausalLM]):
        super().__init__()
        prefix = f"model.layers.{layer_index}"
        self.self_attn = GemmaAttention(config, build, layer_type, layer_index, f"{prefix}.self_attn", family)
        self.mlp = GemmaMLP(config, build, f"{prefix}.mlp")
        norm = lambda: GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, dtype=build.dtype)  # noqa: E731
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def forward(self, angles: RotaryAngles, hidden: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        attended = self.self_attn(angles, self.input_layernorm(hidden), ctx)
        hidden = hidden + self.post_attention_layernorm(attended)
        fed = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(fed)


class GemmaModel(nn.Module):
    """Scaled embedding, decoder layers, final norm; one rotary table per layer type that needs its own."""

    def __init__(self, config: Any, build: ModelBuildContext, family: type[Gemma2ForCausalLM]):
        super().__init__()
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("Gemma with use_bidirectional_attention (EmbeddingGemma) is not supported: tokenmill's "
                             "Gemma layers attend causally")
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype=build.dtype)
        # HF rounds sqrt(hidden) to the activation dtype before multiplying (55.4256 -> 55.5 in bf16)
        self.register_buffer("normalizer", torch.tensor(config.hidden_size**0.5, dtype=build.dtype), persistent=False)
        self.layer_types = gemma_layer_types(config, family.default_sliding_window_pattern)
        self.rotary = nn.ModuleDict({
            layer_type: family.rotary_for_layer_type(config, layer_type, build.device)
            for layer_type in dict.fromkeys(self.layer_types)
        })
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, build, layer_type, i, family)
            for i, layer_type in enumerate(self.layer_types)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, dtype=build.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.normalizer
        angles = {name: rotary.angles(positions, hidden.dtype) for name, rotary in self.rotary.items()}
        for layer, layer_type in zip(self.layers, self.layer_types, strict=True):
            hidden = layer(angles[layer_type], hidden, ctx)
        return self.norm(hidden)


class Gemma2ForCausalLM(nn.Module):
    """Gemma 2: one rotary table for every layer, no q/k norm, attention logits soft-capped by
    ``attn_logit_softcapping`` and final logits by ``final_logit_softcapping``. The LM head is tied
    to the embedding unless ``tie_word_embeddings`` is false."""

    qk_norm: ClassVar[bool] = False
    is_encoder: ClassVar[bool] = False
    default_pooling: ClassVar[PoolingConfig] = DEFAULT_DECODER_POOLING
    default_sliding_window_pattern: ClassVar[int] = 2

    @classmethod
    def rotary_for_layer_type(cls, config: Any, layer_type: str, device: Any) -> RotaryEmbedding:
        """The rotary table layers of ``layer_type`` use."""
        return build_rotary(config, head_size(config), device=device)

    @classmethod
    def attention_soft_cap(cls, config: Any) -> float | None:
        """The attention logits soft-cap: ``attn_logit_softcapping``."""
        return getattr(config, "attn_logit_softcapping", None) or None

    def __init__(self, hf_config: Any, build: ModelBuildContext):
        super().__init__()
        self.config = hf_config
        self.model = GemmaModel(hf_config, build, type(self))
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", True))
        tied_to = self.model.embed_tokens if self.tie_word_embeddings else None
        self.lm_head = build.lm_head(hf_config.vocab_size, hf_config.hidden_size, tied_to=tied_to)
        self.final_logit_softcapping = getattr(hf_config, "final_logit_softcapping", None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Hidden states [T, hidden] of a flat step batch."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab], soft-capped when the config says so."""
        return soft_cap(self.lm_head(hidden), self.final_logit_softcapping)

    def greedy_token_ids(self, hidden: torch.Tensor) -> None:
        """None: the soft-capped logits are computed in full (``compute_logits``)."""
        return None

    def attention_specs(self) -> list[AttentionSpec]:
        """One AttentionSpec per layer, in layer order (the order of ``ctx.kv_caches``)."""
        return [layer.self_attn.attn.spec for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face checkpoint tensors into the parameters; returns the names now loaded."""
        ignore = ("lm_head.weight",) if self.tie_word_embeddings else ()
        return load_checkpoint_weights(self, weights, ignore=ignore)
