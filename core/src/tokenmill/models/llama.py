"""LlamaForCausalLM and the Llama family built on it (Mistral here; Qwen2 and Qwen3 subclass it).

The model contract every tokenmill model follows:

Every model implements ``tokenmill.plugin_api.Model`` (constructed with core's
``ModelBuildContext``, the ``BuildContext`` of the contract; ``forward`` receives an
``AttentionContext``, its ``StepContext``).

Family members differ only through the class-level hooks ``qkv_bias``, ``o_bias``, ``qk_norm``
and ``sliding_window``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from tokenmill.layers.activation import SiluAndMul
from tokenmill.layers.attention import Attention
from tokenmill.layers.context import AttentionContext, ModelBuildContext
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.pooling import DEFAULT_DECODER_POOLING, PoolingConfig
from tokenmill.layers.rotary import RotaryAngles, build_rotary
from tokenmill.models.weight_mapping import load_checkpoint_weights
from tokenmill.plugin_api import AttentionSpec


def head_size(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_sliding_window(config: Any, layer_index: int) -> int | None:
    """``sliding_window`` for layers marked "sliding_attention" in ``layer_types``, or for every
    layer when the config has no ``layer_types`` (Mistral)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or layer_types is None:
        return window
    return window if layer_types[layer_index] == "sliding_attention" else None


class LlamaMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one linear layer."""

    def __init__(self, config: Any, build: ModelBuildContext, prefix: str):
        super().__init__()
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{prefix}: activation {act!r} is not supported (supported: silu)")
        bias = getattr(config, "mlp_bias", False)
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_up_proj = build.linear(f"{prefix}.gate_up_proj", hidden, (inner, inner), bias)
        self.down_proj = build.linear(f"{prefix}.down_proj", inner, (hidden,), bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaSelfAttention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k RMSNorm, rotary embedding, paged attention."""

    def __init__(self, config: Any, build: ModelBuildContext, layer_index: int, prefix: str,
                 family: type[LlamaForCausalLM]):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_size = head_size(config)
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        self.output_sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = build.linear(f"{prefix}.qkv_proj", config.hidden_size, self.output_sizes,
                                     family.qkv_bias(config))
        self.o_proj = build.linear(f"{prefix}.o_proj", q_size, (config.hidden_size,), family.o_bias(config))
        if family.qk_norm:
            self.q_norm = RMSNorm(self.head_size, config.rms_norm_eps, dtype=build.dtype)
            self.k_norm = RMSNorm(self.head_size, config.rms_norm_eps, dtype=build.dtype)
        spec = build.attention_spec(self.num_heads, self.num_kv_heads, self.head_size,
                                    sliding_window=family.sliding_window(config, layer_index))
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


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, residual carried alongside (fused add + norm)."""

    def __init__(self, config: Any, build: ModelBuildContext, layer_index: int, family: type[LlamaForCausalLM]):
        super().__init__()
        prefix = f"model.layers.{layer_index}"
        self.self_attn = LlamaSelfAttention(config, build, layer_index, f"{prefix}.self_attn", family)
        self.mlp = LlamaMLP(config, build, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=build.dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=build.dtype)

    def forward(self, angles: RotaryAngles, hidden: torch.Tensor, residual: torch.Tensor | None,
                ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(angles, hidden, ctx)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers and the final norm; module paths match the checkpoint's ``model.``."""

    def __init__(self, config: Any, build: ModelBuildContext, family: type[LlamaForCausalLM]):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype=build.dtype)
        self.rotary = build_rotary(config, head_size(config), device=build.device)
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


class LlamaForCausalLM(nn.Module):
    """Llama: attention/MLP biases from ``attention_bias`` / ``mlp_bias``, ``head_dim`` when the
    config has one, tied embeddings from ``tie_word_embeddings``."""

    qk_norm: ClassVar[bool] = False
    is_encoder: ClassVar[bool] = False
    default_pooling: ClassVar[PoolingConfig] = DEFAULT_DECODER_POOLING

    @classmethod
    def qkv_bias(cls, config: Any) -> bool:
        return bool(getattr(config, "attention_bias", False))

    @classmethod
    def o_bias(cls, config: Any) -> bool:
        return bool(getattr(config, "attention_bias", False))

    @classmethod
    def sliding_window(cls, config: Any, layer_index: int) -> int | None:
        return layer_sliding_window(config, layer_index)

    def __init__(self, hf_config: Any, build: ModelBuildContext):
        super().__init__()
        self.config = hf_config
        self.model = LlamaModel(hf_config, build, type(self))
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        tied_to = self.model.embed_tokens if self.tie_word_embeddings else None
        self.lm_head = build.lm_head(hf_config.vocab_size, hf_config.hidden_size, tied_to=tied_to)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Hidden states [T, hidden] of a flat step batch."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab] for the rows of ``hidden`` the caller selected."""
        return self.lm_head(hidden)

    def greedy_token_ids(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``compute_logits(hidden).argmax(-1)`` where the platform can take it without every logit, else None."""
        return self.lm_head.greedy_token_ids(hidden)

    def attention_specs(self) -> list[AttentionSpec]:
        """One AttentionSpec per layer, in layer order (the order of ``ctx.kv_caches``)."""
        return [layer.self_attn.attn.spec for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face checkpoint tensors into the parameters; returns the parameter names
        now fully loaded. A tied model ignores a shipped ``lm_head.weight``."""
        ignore = ("lm_head.weight",) if self.tie_word_embeddings else ()
        return load_checkpoint_weights(self, weights, ignore=ignore)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama with a sliding window on every layer when ``sliding_window`` is set."""
