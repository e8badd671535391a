"""Embedder: whole prompts -> pooled embeddings, beside the generation loop (no scheduler).

An embedding request needs one forward over its whole prompt and nothing after it, so the
embedder batches prompts itself (up to ``max_batch_tokens`` per forward) and never touches the
engine's KV cache or scheduler:

* encoders (``model.is_encoder``) run their dense bidirectional path (``embed_hidden``);
* decoders run their normal forward as fresh causal prefills through the step's attention
  backend, on a transient KV cache sized for the batch and dropped after it.

Hidden states are then pooled (``tokenmill.layers.pooling``). ``embed_for_api`` shapes the result
as OpenAI's /v1/embeddings response (floats or base64 float32, ``embedding_inputs``). The server
runs the same Embedder inside the engine-core process (``core_process``), between steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenmill.engine.embedding_inputs import (
    checked_embedding_ids,
    embedding_prompts,
    embedding_response,
    encode_embedding,
)
from tokenmill.layers.context import AttentionContext
from tokenmill.layers.pooling import PoolingConfig, pool
from tokenmill.plugin_api import AttentionBackend, AttentionBatch

__all__ = ["DEFAULT_DECODER_POOLING", "Embedder", "EmbeddingOutput", "EmbeddingRequestOutput", "embed_for_api",
           "encode_embedding", "fresh_prefill_batch", "tokenize_for_embedding"]

DEFAULT_DECODER_POOLING = PoolingConfig(method="last", normalize=True)


@dataclass
class EmbeddingOutput:
    """One prompt's embedding (vLLM's ``outputs.embedding``)."""

    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """What ``LLM.embed`` returns per prompt."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


def fresh_prefill_batch(seq_lens: Sequence[int], block_size: int, device: torch.device) -> AttentionBatch:
    """The AttentionBatch of whole prompts prefilled from nothing, each on its own consecutive
    blocks of a transient cache (block 0 is never used, as in the engine)."""
    tables, first = [], 1
    for n in seq_lens:
        count = -(-n // block_size)
        tables.append(list(range(first, first + count)))
        first += count
    return AttentionBatch.build(list(seq_lens), [0] * len(seq_lens), tables, block_size, device=device)


class Embedder:
    """Pooled embeddings from a loaded model, in batches of at most ``max_batch_tokens`` tokens."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, device: torch.device, pooling: PoolingConfig,
                 *, max_batch_tokens: int = 2048, block_size: int = 16) -> None:
        self.model = model
        self.backend = backend
        self.device = device
        self.pooling = pooling
        self.max_batch_tokens = max_batch_tokens
        self.block_size = block_size

    @classmethod
    def for_engine(cls, engine: Any, pooling: PoolingConfig | None = None) -> Embedder:
        """An embedder over an in-process LLMEngine's model; ``pooling`` None means the model
        directory's sentence-transformers pooling, else the model kind's default."""
        return cls.for_core(engine.core, engine.config, pooling)

    @classmethod
    def for_core(cls, core: Any, config: Any, pooling: PoolingConfig | None = None) -> Embedder:
        """An embedder over an EngineCore's loaded model (``config``: its resolved EngineConfig)."""
        runner = core.runner
        model = runner.model
        if pooling is None:
            default = getattr(model, "default_pooling", DEFAULT_DECODER_POOLING)
            pooling = PoolingConfig.from_model_dir(config.model.path, default)
        return cls(model, runner.backend, runner.device, pooling, max_batch_tokens=config.max_num_batched_tokens,
                   block_size=config.cache.block_size)

    def plan_batches(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Prompt indices grouped into forwards of at most ``max_batch_tokens`` tokens (a longer
        prompt runs alone), in order."""
        batches, current, tokens = [], [], 0
        for index, prompt in enumerate(prompts):
            if current and tokens + len(prompt) > self.max_batch_tokens:
                batches.append(current)
                current, tokens = [], 0
            current.append(index)
            tokens += len(prompt)
        return batches + [current] if current else batches

    def _hidden(self, prompts: list[Sequence[int]]) -> torch.Tensor:
        seq_lens = [len(p) for p in prompts]
        input_ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=self.device)
        positions = torch.cat([torch.arange(n) for n in seq_lens]).to(self.device)
        if getattr(self.model, "is_encoder", False):
            return self.model.embed_hidden(input_ids, positions, seq_lens)
        batch = fresh_prefill_batch(seq_lens, self.block_size, self.device)
        num_blocks = 1 + sum(-(-n // self.block_size) for n in seq_lens)
        caches = [torch.zeros(self.backend.kv_cache_shape(num_blocks, self.block_size, s.num_kv_heads, s.head_size),
                              dtype=self.backend.kv_cache_torch_dtype(s), device=self.device)
                  for s in self.model.attention_specs()]
        ctx = AttentionContext(backend=self.backend, metadata=self.backend.plan(batch), kv_caches=caches)
        return self.model(input_ids, positions, ctx)

    @torch.inference_mode()
    def embed_batch(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Float32 embeddings [len(prompts), hidden] of one forward's prompts (see ``plan_batches``)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("cannot embed an empty prompt")
        return pool(self._hidden(list(prompts)), [len(p) for p in prompts], self.pooling)

    def embed(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Float32 embeddings [len(prompts), hidden] of token-id prompts, in order."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("cannot embed an empty prompt")
        rows: list[torch.Tensor | None] = [None] * len(prompts)
        for batch in self.plan_batches(prompts):
            for index, row in zip(batch, self.embed_batch([prompts[i] for i in batch]), strict=True):
                rows[index] = row
        return torch.stack(rows) if rows else torch.empty(0)


def embed_for_api(llm_or_engine: Any, inputs: str | Sequence[Any], encoding_format: str = "float",
                  model_name: str | None = None) -> dict[str, Any]:
    """The OpenAI /v1/embeddings response body (``embedding_response``) for ``inputs`` on an ``LLM``
    or in-process ``LLMEngine``. Raises ValueError for bad input (empty, too long, wrong types,
    unknown encoding) — a 400 for the server."""
    engine = getattr(llm_or_engine, "engine", llm_or_engine)
    if encoding_format not in ("float", "base64"):
        raise ValueError(f"encoding_format must be 'float' or 'base64', not {encoding_format!r}")
    token_ids = embedding_prompts(engine.inputs, engine.config.model, inputs)
    vectors = Embedder.for_engine(engine).embed(token_ids).cpu().numpy()
    return embedding_response(vectors, sum(len(t) for t in token_ids), encoding_format,
                              model_name or engine.config.model.served_model_name)


def tokenize_for_embedding(engine: Any, prompt: Any) -> list[int]:
    """Token ids of one prompt, checked against the vocabulary and ``max_model_len`` (an
    embedding may use the whole context: nothing is generated after it)."""
    return checked_embedding_ids(engine.inputs, engine.config.model, prompt)
