"""Decoder embedding backbones (``LlamaModel``, ``Qwen3Model`` ...): causal-LM classes without an LM head.

Embedding checkpoints such as Qwen3-Embedding or gte-Qwen2 ship them, with tensors named with
or without the ``model.`` prefix. Their embeddings are a
pooled hidden state (last token, normalised, unless the directory's sentence-transformers files
say otherwise); they cannot generate."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from tokenmill.layers.context import ModelBuildContext
from tokenmill.layers.pooling import PoolingConfig
from tokenmill.models.gemma2 import Gemma2ForCausalLM
from tokenmill.models.gemma3 import Gemma3ForCausalLM
from tokenmill.models.llama import LlamaForCausalLM, MistralForCausalLM
from tokenmill.models.qwen2 import Qwen2ForCausalLM
from tokenmill.models.qwen3 import Qwen3ForCausalLM


def _with_model_prefix(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        if name.startswith("lm_head."):
            continue
        yield (name if name.startswith("model.") else f"model.{name}"), tensor


class DecoderEmbeddingMixin:
    """Drops the LM head of the causal-LM class it precedes and accepts unprefixed tensor names."""

    default_pooling: ClassVar[PoolingConfig] = PoolingConfig(method="last", normalize=True)

    def __init__(self, hf_config: Any, build: ModelBuildContext):
        super().__init__(hf_config, build)
        self.tie_word_embeddings = False
        self.lm_head = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Embedding backbones have no LM head."""
        raise TypeError(f"{type(self).__name__} is an embedding model without an LM head: use LLM.embed")

    def greedy_token_ids(self, hidden: torch.Tensor) -> None:
        """No LM head to take an argmax of (``compute_logits`` says so)."""
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The causal-LM loading, after prefixing bare backbone names with ``model.``."""
        return super().load_weights(_with_model_prefix(weights))


class LlamaModel(DecoderEmbeddingMixin, LlamaForCausalLM):
    """Llama backbone for embeddings."""


class MistralModel(DecoderEmbeddingMixin, MistralForCausalLM):
    """Mistral backbone for embeddings (e5-mistral, SFR-Embedding)."""


class Qwen2Model(DecoderEmbeddingMixin, Qwen2ForCausalLM):
    """Qwen2 backbone for embeddings (gte-Qwen2)."""


class Qwen3Model(DecoderEmbeddingMixin, Qwen3ForCausalLM):
    """Qwen3 backbone for embeddings (Qwen3-Embedding)."""


class Gemma2Model(DecoderEmbeddingMixin, Gemma2ForCausalLM):
    """Gemma 2 backbone for embeddings."""


class Gemma3TextModel(DecoderEmbeddingMixin, Gemma3ForCausalLM):
    """Gemma 3 text backbone for embeddings (causal attention only)."""
