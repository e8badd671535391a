"""EmbeddingJobs: the engine core's embedding requests, each prompt a pooling request of the scheduler.

An embedding request (several prompts, one pooling) becomes one pooling ``Request`` per prompt; the
scheduler runs them as prefill chunks beside every other request, batching several prompts in one
step, and frees their blocks as their last chunk runs (an encoder, without a KV cache, is scheduled
whole). Each finished prompt brings its pooled vector; once every prompt of a request has one, its
float32 rows [prompts, hidden], in prompt order, are ready for ``take_finished``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenmill.layers.pooling import PoolingConfig
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams

_POOLING_PARAMS = SamplingParams(max_tokens=1)  # never sampled: the K/V a pooling request needs is its prompt's


@dataclass
class _Job:
    rows: list[np.ndarray | None]
    pending: set[str] = field(default_factory=set)  # ids of its pooling requests still in the scheduler


class EmbeddingJobs:
    """Embedding requests by id, the pooling requests that serve them, and the finished ones' rows."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._owner: dict[str, tuple[str, int]] = {}  # pooling request id -> (embedding request id, prompt index)
        self._finished: dict[str, np.ndarray] = {}

    def open(self, request_id: str, prompts: Sequence[Sequence[int]], pooling: PoolingConfig) -> list[Request]:
        """The pooling requests of a new embedding request (to add to the scheduler); ValueError for an id
        in use or an empty prompt. Without prompts the request is finished at once, with no rows."""
        if request_id in self._jobs or request_id in self._finished:
            raise ValueError(f"embedding request id {request_id!r} is already in use")
        if any(len(prompt) == 0 for prompt in prompts):
            raise ValueError("cannot embed an empty prompt")
        if not prompts:
            self._finished[request_id] = np.empty((0, 0), dtype="<f4")
            return []
        requests = [Request(f"{request_id}/embed-{index}", prompt, _POOLING_PARAMS, pooling=pooling)
                    for index, prompt in enumerate(prompts)]
        self._jobs[request_id] = _Job([None] * len(prompts), {r.request_id for r in requests})
        for index, request in enumerate(requests):
            self._owner[request.request_id] = (request_id, index)
        return requests

    def complete(self, pooling_request_id: str, vector: np.ndarray) -> None:
        """A pooling request's vector; finishes its embedding request when it was the last one pending."""
        request_id, index = self._owner.pop(pooling_request_id)
        job = self._jobs[request_id]
        job.rows[index] = vector
        job.pending.discard(pooling_request_id)
        if not job.pending:
            del self._jobs[request_id]
            self._finished[request_id] = np.stack(job.rows).astype("<f4", copy=False)

    def close(self, request_ids: Iterable[str]) -> list[str]:
        """Forget these embedding requests (aborted, or refused); returns the ids of their pooling requests
        still in the scheduler, for the caller to abort there."""
        pending = []
        for request_id in request_ids:
            self._finished.pop(request_id, None)
            job = self._jobs.pop(request_id, None)
            if job is not None:
                for pooling_request_id in job.pending:
                    del self._owner[pooling_request_id]
                pending += job.pending
        return pending

    def take_finished(self) -> dict[str, np.ndarray]:
        """The rows of every embedding request finished since the last call, by request id."""
        finished, self._finished = self._finished, {}
        return finished
