"""BertModel: a BERT-style encoder for embeddings (all-MiniLM, BGE, E5 ...).

Encoder attention is bidirectional and an embedding request is processed whole in one pass, so
encoders take a dense path with no KV cache: the flat batch is split by sequence, padded to
[B, L], and attended with a key-padding mask in one ``scaled_dot_product_attention``. The model
has no attention specs (nothing is cached) and cannot generate.

Pooling models expose ``embed_hidden(input_ids, positions, seq_lens) -> [T, hidden]`` (what the
model runner calls on a step of whole prompts); ``is_encoder`` tells the engine builder and the
runner that steps never plan paged attention and prompts are never split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from tokenmill.layers.context import AttentionContext, ModelBuildContext
from tokenmill.layers.gated_activation import activation
from tokenmill.layers.pooling import PoolingConfig
from tokenmill.models.weight_mapping import load_checkpoint_weights
from tokenmill.plugin_api import AttentionSpec

QKV_SHARDS = (("qkv_proj", "query", 0), ("qkv_proj", "key", 1), ("qkv_proj", "value", 2))
IGNORED = ("pooler.", "cls.", "embeddings.position_ids")


def padded(x: torch.Tensor, seq_lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat [T, ...] -> ([B, L, ...] zero-padded, bool mask [B, L] of real tokens)."""
    lens = torch.tensor(list(seq_lens), device=x.device)
    width = int(max(seq_lens))
    mask = torch.arange(width, device=x.device)[None, :] < lens[:, None]
    out = x.new_zeros(len(seq_lens), width, *x.shape[1:])
    out[mask] = x
    return out, mask


class BertSelfAttention(nn.Module):
    """Fused q/k/v with biases, bidirectional attention over each sequence's own tokens."""

    def __init__(self, config: Any, build: ModelBuildContext, prefix: str):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = hidden // self.num_heads
        self.qkv_proj = build.linear(f"{prefix}.qkv_proj", hidden, (hidden, hidden, hidden), True)

    def forward(self, x: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        qkv, mask = padded(self.qkv_proj(x), seq_lens)
        batch, width = mask.shape
        q, k, v = qkv.view(batch, width, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return out.transpose(1, 2).reshape(batch, width, -1)[mask]


class BertLayer(nn.Module):
    """Post-norm block: ``LN(x + attn(x))`` then ``LN(h + out(act(inter(h))))``; module paths as in HF."""

    def __init__(self, config: Any, build: ModelBuildContext, prefix: str):
        super().__init__()
        hidden, inner, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        self.attention = nn.Module()
        self.attention.self = BertSelfAttention(config, build, f"{prefix}.attention.self")
        self.attention.output = nn.Module()
        self.attention.output.dense = build.linear(f"{prefix}.attention.output.dense", hidden, (hidden,), True)
        self.attention.output.LayerNorm = nn.LayerNorm(hidden, eps=eps, dtype=build.dtype)
        self.intermediate = nn.Module()
        self.intermediate.dense = build.linear(f"{prefix}.intermediate.dense", hidden, (inner,), True)
        self.output = nn.Module()
        self.output.dense = build.linear(f"{prefix}.output.dense", inner, (hidden,), True)
        self.output.LayerNorm = nn.LayerNorm(hidden, eps=eps, dtype=build.dtype)
        self.act = activation(config.hidden_act, prefix)

    def forward(self, x: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        attended = self.attention.output.dense(self.attention.self(x, seq_lens))
        h = self.attention.output.LayerNorm(attended + x)
        out = self.output.dense(self.act(self.intermediate.dense(h)))
        return self.output.LayerNorm(out + h)


class BertEmbeddings(nn.Module):
    """Word + absolute position + token type (always type 0) embeddings, then LayerNorm."""

    def __init__(self, config: Any, build: ModelBuildContext):
        super().__init__()
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BERT position embeddings {config.position_embedding_type!r} are not supported "
                             f"(supported: absolute)")
        hidden = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden, dtype=build.dtype)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden, dtype=build.dtype)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, hidden, dtype=build.dtype)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps, dtype=build.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x + self.position_embeddings(positions))


class BertModel(nn.Module):
    """The encoder of a BERT checkpoint (with or without a ``bert.`` prefix; pooler and MLM heads ignored)."""

    is_encoder: ClassVar[bool] = True
    default_pooling: ClassVar[PoolingConfig] = PoolingConfig(method="cls", normalize=True)

    def __init__(self, hf_config: Any, build: ModelBuildContext):
        super().__init__()
        self.config = hf_config
        self.embeddings = BertEmbeddings(hf_config, build)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(
            BertLayer(hf_config, build, f"encoder.layer.{i}") for i in range(hf_config.num_hidden_layers)
        )
        self.requires_grad_(False)

    def embed_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        """Hidden states [T, hidden] of whole sequences laid end to end (lengths ``seq_lens``)."""
        x = self.embeddings(input_ids, positions)
        for layer in self.encoder.layer:
            x = layer(x, seq_lens)
        return x

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Encoders do not run engine steps: they embed whole sequences (``LLM.embed``)."""
        raise TypeError("BertModel is an encoder-only embedding model: use LLM.embed, not generate")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Encoders have no language-model head."""
        raise TypeError("BertModel is an encoder-only embedding model and has no logits")

    def greedy_token_ids(self, hidden: torch.Tensor) -> None:
        """No language-model head to take an argmax of (``compute_logits`` says so)."""
        return None

    def attention_specs(self) -> list[AttentionSpec]:
        """None: an encoder keeps no KV cache."""
        return []

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (``bert.``-prefixed or not) into the parameters; returns the names loaded."""
        renamed = ((name.removeprefix("bert."), tensor) for name, tensor in weights)
        return load_checkpoint_weights(self, renamed, stacked=QKV_SHARDS, ignore=IGNORED)
