"""Embeddings in the engine core: which pooling a loaded model's embedding requests get.

An embedding prompt is a pooling request of the scheduler (``EngineCore.add_embedding``): it runs as
scheduled prefill chunks beside every other request, several prompts batched in one step, and never
decodes; the runner pools its hidden states (``runner.pooled_states``) as its last chunk runs, and
its blocks are freed then. Encoders (``model.is_encoder``) run their dense bidirectional path on
whole prompts, without a KV cache. The server's engine-core process queues these requests between its
steps (``core_process``); an in-process engine is driven by the front end
(``tokenmill.frontend.offline_embedding``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tokenmill.layers.pooling import DEFAULT_DECODER_POOLING, PoolingConfig

__all__ = ["DEFAULT_DECODER_POOLING", "model_pooling"]


def model_pooling(model: Any, model_path: str, method: str | None = None,
                  normalize: bool | None = None) -> PoolingConfig:
    """The pooling of a loaded model: its directory's sentence-transformers files when present, else the
    model kind's default (encoders: CLS, decoders: last token; normalised), with ``method`` and
    ``normalize`` overriding it when given. ValueError for a pooling tokenmill does not implement."""
    pooling = PoolingConfig.from_model_dir(model_path, model.default_pooling)
    overrides = {k: v for k, v in (("method", method), ("normalize", normalize)) if v is not None}
    return replace(pooling, **overrides) if overrides else pooling
