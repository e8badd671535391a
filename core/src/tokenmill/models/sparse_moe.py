"""MoeForCausalLM: the decoder shared by Mixtral, Qwen2-MoE and Qwen3-MoE.

Llama-family attention, and a sparse mixture-of-experts block (optionally with a gated shared
expert) in place of the MLP on the layers the config makes sparse.

Family members set the checkpoint's block name (``moe_prefix``), the names of each expert's
three projections (``expert_parts``), the config fields they read, and inherit the attention
hooks (``qkv_bias``, ``o_bias``, ``qk_norm``, ``sliding_window``) of their dense sibling.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext, ModelBuildContext
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.layers.gated_activation import GatedActivation
from tokenmill.layers.moe import FusedMoE, RouterLinear
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryAngles, build_rotary
from tokenmill.models.llama import LlamaForCausalLM, LlamaSelfAttention, head_size
from tokenmill.models.weight_mapping import load_checkpoint_weights
from tokenmill.reference.unquantized import Unquantized


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` of a given inner size (dense layers, shared experts)."""

    def __init__(self, build: ModelBuildContext, prefix: str, hidden: int, inner: int, act: str):
        super().__init__()
        self.gate_up_proj = build.linear(f"{prefix}.gate_up_proj", hidden, (inner, inner), False)
        self.down_proj = build.linear(f"{prefix}.down_proj", inner, (hidden,), False)
        self.act = GatedActivation(act, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    """Router ``gate``, routed ``experts``, and when ``shared_inner`` is set a shared expert
    scaled by ``sigmoid(shared_expert_gate(x))`` and added to the routed output."""

    def __init__(self, config: Any, build: ModelBuildContext, prefix: str, family: type[MoeForCausalLM]):
        super().__init__()
        hidden = config.hidden_size
        act = getattr(config, "hidden_act", "silu")
        num_experts = family.num_experts(config)
        self.gate = RouterLinear(hidden, num_experts, dtype=build.dtype)
        self.experts = FusedMoE(num_experts, config.num_experts_per_tok, hidden, family.expert_inner_size(config), act,
                                renormalize=family.renormalize(config), float32_weights=family.float32_routing_weights,
                                dtype=build.dtype)
        shared_inner = family.shared_expert_inner_size(config)
        if shared_inner:
            self.shared_expert = GatedMLP(build, f"{prefix}.shared_expert", hidden, shared_inner, act)
            self.shared_expert_gate = RouterLinear(hidden, 1, dtype=build.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x))
        if hasattr(self, "shared_expert"):
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class MoeDecoderLayer(nn.Module):
    """Pre-norm attention and (sparse or dense) feed-forward, residual carried alongside."""

    def __init__(self, config: Any, build: ModelBuildContext, layer_index: int, family: type[MoeForCausalLM]):
        super().__init__()
        prefix = f"model.layers.{layer_index}"
        self.self_attn = LlamaSelfAttention(config, build, layer_index, f"{prefix}.self_attn", family)
        if family.is_sparse_layer(config, layer_index):
            self.ffn_name = family.moe_prefix
            ffn = SparseMoeBlock(config, build, f"{prefix}.{family.moe_prefix}", family)
        else:
            self.ffn_name = "mlp"
            ffn = GatedMLP(build, f"{prefix}.mlp", config.hidden_size, config.intermediate_size,
                           getattr(config, "hidden_act", "silu"))
        self.add_module(self.ffn_name, ffn)
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
        return getattr(self, self.ffn_name)(hidden), residual


class MoeModel(nn.Module):
    """Embedding, decoder layers and the final norm; module paths match the checkpoint's ``model.``."""

    def __init__(self, config: Any, build: ModelBuildContext, family: type[MoeForCausalLM]):
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype=build.dtype)
        self.rotary = build_rotary(config, head_size(config), device=build.device)
        self.layers = nn.ModuleList(MoeDecoderLayer(config, build, i, family) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=build.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        angles = self.rotary.angles(positions, hidden.dtype)
        for layer in self.layers:
            hidden, residual = layer(angles, hidden, residual, ctx)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class MoeForCausalLM(LlamaForCausalLM):
    """Base of the MoE families; subclasses fill in the hooks below."""

    moe_prefix: ClassVar[str] = "mlp"
    expert_parts: ClassVar[dict[str, str]] = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    float32_routing_weights: ClassVar[bool] = False

    @classmethod
    def num_experts(cls, config: Any) -> int:
        return config.num_experts

    @classmethod
    def expert_inner_size(cls, config: Any) -> int:
        return config.moe_intermediate_size

    @classmethod
    def shared_expert_inner_size(cls, config: Any) -> int:
        return 0

    @classmethod
    def renormalize(cls, config: Any) -> bool:
        return bool(getattr(config, "norm_topk_prob", False))

    @classmethod
    def is_sparse_layer(cls, config: Any, layer_index: int) -> bool:
        """Sparse unless listed in ``mlp_only_layers``, every ``decoder_sparse_step``-th layer."""
        if layer_index in (getattr(config, "mlp_only_layers", None) or ()):
            return False
        step = getattr(config, "decoder_sparse_step", 1) or 1
        return cls.num_experts(config) > 0 and (layer_index + 1) % step == 0

    def __init__(self, hf_config: Any, build: ModelBuildContext):
        nn.Module.__init__(self)
        if build.quantizer is not None and not isinstance(build.quantizer, Unquantized):
            raise ValueError(f"{type(self).__name__}: quantized mixture-of-experts checkpoints are not supported yet "
                             f"({build.quantizer.name}); use an unquantized checkpoint")
        self.config = hf_config
        self.model = MoeModel(hf_config, build, type(self))
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        tied_to = self.model.embed_tokens if self.tie_word_embeddings else None
        self.lm_head = build.lm_head(hf_config.vocab_size, hf_config.hidden_size, tied_to=tied_to)
        block = re.escape(self.moe_prefix)
        parts = "|".join(map(re.escape, self.expert_parts))
        self._expert_name = re.compile(rf"model\.layers\.(\d+)\.{block}\.experts\.(\d+)\.({parts})\.weight")
        self._stacked_name = re.compile(rf"model\.layers\.(\d+)\.{block}\.experts\.(gate_up_proj|down_proj)")

    def _experts(self, layer: str) -> FusedMoE:
        block = getattr(self.model.layers[int(layer)], self.moe_prefix, None)
        if not isinstance(block, SparseMoeBlock):
            raise ValueError(f"layer {layer} of the model is dense, but the checkpoint has experts for it")
        return block.experts

    def _route_experts(self, weights: Iterable[tuple[str, torch.Tensor]], loaded: set[str]
                       ) -> Iterator[tuple[str, torch.Tensor]]:
        """Load expert tensors on the way; yield every other tensor."""
        for name, tensor in weights:
            if match := self._expert_name.fullmatch(name):
                layer, expert, part = match.groups()
                self._experts(layer).load_expert(int(expert), self.expert_parts[part], tensor)
            elif match := self._stacked_name.fullmatch(name):
                layer, stacked = match.groups()
                self._experts(layer).load_stacked("gate_up" if stacked == "gate_up_proj" else "down", tensor)
            else:
                yield name, tensor
                continue
            loaded.add(f"model.layers.{layer}.{self.moe_prefix}.experts")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load expert tensors (one per expert and projection, or already stacked) into the stacked
        weights and everything else by name; returns the parameter names now complete."""
        touched: set[str] = set()
        ignore = ("lm_head.weight",) if self.tie_word_embeddings else ()
        loaded = load_checkpoint_weights(self, self._route_experts(weights, touched), ignore=ignore)
        modules = dict(self.named_modules())
        for path in touched:
            loaded |= {f"{path}.{name}" for name in modules[path].complete()}
        return loaded
