"""Embeddings in the engine: a model's pooling, in-process embedding through the scheduler, the OpenAI body.

An embedding prompt is a pooling request of the scheduler (``EngineCore.add_embedding``): it runs as
scheduled prefill chunks beside every other request, several prompts batched in one step, and never
decodes; the runner pools its hidden states (``runner.pooled_states``) as its last chunk runs, and
its blocks are freed then. Encoders (``model.is_encoder``) run their dense bidirectional path on
whole prompts, without a KV cache. ``embed_in_process`` drives an in-process engine (``LLM.embed``);
the server's engine-core process queues the same requests between its steps (``core_process``).
``embed_for_api`` shapes the result as OpenAI's /v1/embeddings response (floats or base64 float32,
``embedding_inputs``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenmill.frontend.embedding_inputs import (
    checked_embedding_ids,
    embedding_prompts,
    embedding_response,
    encode_embedding,
)
from tokenmill.layers.pooling import DEFAULT_DECODER_POOLING, PoolingConfig

__all__ = ["DEFAULT_DECODER_POOLING", "EmbeddingOutput", "EmbeddingRequestOutput", "embed_for_api", "embed_in_process",
           "encode_embedding", "model_pooling", "tokenize_for_embedding"]

_EMBEDDING_IDS = itertools.count()


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


def model_pooling(model: Any, model_path: str, method: str | None = None,
                  normalize: bool | None = None) -> PoolingConfig:
    """The pooling of a loaded model: its directory's sentence-transformers files when present, else the
    model kind's default (encoders: CLS, decoders: last token; normalised), with ``method`` and
    ``normalize`` overriding it when given. ValueError for a pooling tokenmill does not implement."""
    pooling = PoolingConfig.from_model_dir(model_path, model.default_pooling)
    overrides = {k: v for k, v in (("method", method), ("normalize", normalize)) if v is not None}
    return replace(pooling, **overrides) if overrides else pooling


def embed_in_process(engine: Any, token_ids: Sequence[Sequence[int]],
                     pooling: PoolingConfig | None = None) -> np.ndarray:
    """Float32 embeddings [prompts, hidden] of checked token-id prompts, in order, through an in-process
    LLMEngine's scheduler (``EngineCore.add_embedding``), stepping the engine until they are pooled.
    RuntimeError while the engine has generation requests, whose outputs those steps would swallow."""
    if engine.has_unfinished_requests():
        raise RuntimeError("an in-process engine embeds only while it generates nothing (finish or abort first)")
    core = engine.core
    if pooling is None:
        pooling = model_pooling(core.runner.model, engine.config.model.path)
    request_id = f"embed-{next(_EMBEDDING_IDS)}"
    core.add_embedding(request_id, token_ids, pooling)
    finished: dict[str, np.ndarray] = {}
    while request_id not in finished:
        engine.step()
        finished.update(core.take_embeddings())
    return finished[request_id]


def embed_for_api(llm_or_engine: Any, inputs: str | Sequence[Any], encoding_format: str = "float",
                  model_name: str | None = None) -> dict[str, Any]:
    """The OpenAI /v1/embeddings response body (``embedding_response``) for ``inputs`` on an ``LLM``
    or in-process ``LLMEngine``. Raises ValueError for bad input (empty, too long, wrong types,
    unknown encoding) — a 400 for the server."""
    engine = getattr(llm_or_engine, "engine", llm_or_engine)
    if encoding_format not in ("float", "base64"):
        raise ValueError(f"encoding_format must be 'float' or 'base64', not {encoding_format!r}")
    token_ids = embedding_prompts(engine.inputs, engine.config.model, inputs)
    vectors = embed_in_process(engine, token_ids)
    return embedding_response(vectors, sum(len(t) for t in token_ids), encoding_format,
                              model_name or engine.config.model.served_model_name)


def tokenize_for_embedding(engine: Any, prompt: Any) -> list[int]:
    """Token ids of one prompt, checked against the vocabulary and ``max_model_len`` (an
    embedding may use the whole context: nothing is generated after it)."""
    return checked_embedding_ids(engine.inputs, engine.config.model, prompt)
