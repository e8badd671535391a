"""The async engine's request outcomes other than tokens: refusals, aborts and embedding results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class QueueFullError(RuntimeError):
    """The waiting queue is full: try again later."""


class RequestRejectedError(ValueError):
    """The engine core refused the request (e.g. it can never fit in the KV cache)."""


class RequestAbortedError(RuntimeError):
    """The server aborted the request (e.g. it is shutting down)."""


@dataclass
class Embeddings:
    """What ``AsyncLLM.embed`` returns: float32 ``vectors`` [inputs, dim] and the inputs' token counts."""

    vectors: Any  # numpy.ndarray
    num_prompt_tokens: list[int]
