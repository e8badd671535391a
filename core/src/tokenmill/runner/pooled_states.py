"""PooledStates: pooling requests' hidden states gathered chunk by chunk, one vector per request at its last chunk.

A pooling request's prompt runs in scheduled prefill chunks like any prompt, so its hidden states
arrive over several steps. Each chunk folds into what its pooling method keeps (the first row for
"cls", the last row for "last", the running sum and count for "mean"); the chunk that ends the prompt
yields the pooled float32 vector, L2-normalised when the request's ``PoolingConfig`` says so. A
prompt that runs in one chunk is pooled by ``layers.pooling.pool`` itself. Pooling requests never
read the prefix cache, so a chunk at position 0 starts the prompt, also after a preemption.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.nn import functional as F

from tokenmill.layers.pooling import PoolingConfig, pool
from tokenmill.scheduler.output import ScheduledRequest


class PooledStates:
    """What each unfinished pooling request keeps of the chunks it has run, by request id."""

    def __init__(self) -> None:
        self._partial: dict[str, tuple[torch.Tensor, int]] = {}  # request id -> (kept rows, tokens so far)

    def add(self, scheduled: ScheduledRequest, hidden: torch.Tensor) -> torch.Tensor | None:
        """Fold one chunk's hidden states [n, hidden] in; the pooled float32 vector [hidden] when the chunk
        ends the prompt (``scheduled.sample``), else None."""
        config: PoolingConfig = scheduled.request.pooling
        request_id = scheduled.request_id
        partial = self._partial.pop(request_id, None)
        if scheduled.start_position == 0:  # the prompt (re)starts: after a preemption nothing kept is valid
            partial = None
        if partial is None and scheduled.sample:
            return pool(hidden, [hidden.shape[0]], config)[0]
        rows = hidden.float()
        kept, count = partial if partial is not None else (None, 0)
        # rows kept are copies: ``hidden`` may be a graph's output buffer, written again by the next step
        if config.method == "cls":
            kept = kept if kept is not None else rows[0].clone()
        elif config.method == "last":
            kept = rows[-1].clone()
        else:
            kept = rows.sum(dim=0) if kept is None else kept + rows.sum(dim=0)
        count += rows.shape[0]
        if not scheduled.sample:
            self._partial[request_id] = (kept, count)
            return None
        pooled = kept / count if config.method == "mean" else kept
        return F.normalize(pooled, p=2, dim=-1) if config.normalize else pooled

    def release(self, request_ids: Iterable[str]) -> None:
        """Forget the chunks of requests that finished or were aborted before their last chunk."""
        for request_id in request_ids:
            self._partial.pop(request_id, None)
