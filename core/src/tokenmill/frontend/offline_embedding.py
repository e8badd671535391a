"""Embeddings in the caller's process: what ``LLM.embed`` returns, and the OpenAI-shaped
``embed_for_api``, over an in-process engine whose scheduler runs the pooling requests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenmill.engine_core.embedding import model_pooling
from tokenmill.frontend.embedding_inputs import checked_embedding_ids, embedding_prompts, embedding_response
from tokenmill.layers.pooling import PoolingConfig

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
