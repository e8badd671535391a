"""KvCachePages: asking the platform to back a KV cache's memory before the first writes would, block by
block, in the order the engine will use the blocks.

The block pool hands out never-used blocks in block order, so backing blocks ``[0, n)`` of every layer
covers the first ``n`` blocks the engine will use: an engine backs ``STARTUP_BYTES`` of them when it is
built, and a server the rest, ``IDLE_CHUNK_BYTES`` at a time, while it is idle. How (or whether) memory
is backed is the platform's (``Platform.back_kv_cache``); where it cannot, the first refusal ends the
work and pages are backed on first write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

STARTUP_BYTES = 1 << 30  # backed when an engine is built: SmolLM2's 64 x 256-token batch needs 754 MB
IDLE_CHUNK_BYTES = 16 << 20  # backed per idle turn of a server: a request arriving meanwhile waits for it

BackBlocks = Callable[[Any, int, int, int], bool]  # (cache, block_dim, start, stop) -> whether it backed them


class KvCachePages:
    """Backs blocks ``[0, n)`` of every layer's cache on request, remembering how far it got; with no
    ``back_blocks`` (or no caches) there is nothing to do."""

    def __init__(self, caches: list[Any], block_dim: int, num_blocks: int, back_blocks: BackBlocks | None) -> None:
        self._caches = [c for c in caches if c.numel()]
        self._block_dim = block_dim
        self._num_blocks = num_blocks
        self._bytes_per_block = sum(c.numel() * c.element_size() for c in self._caches) // max(num_blocks, 1)
        self._back_blocks = back_blocks if self._caches else None
        self.backed = 0 if self._back_blocks is not None else num_blocks  # blocks [0, backed) are backed
        self.seconds = 0.0  # spent in calls of ``back`` that backed blocks

    @property
    def done(self) -> bool:
        """Whether every block is backed (or backing is not possible here)."""
        return self.backed >= self._num_blocks

    def back(self, num_bytes: int) -> int:
        """Back the next ``num_bytes`` worth of blocks (all layers); returns the bytes backed (0 when
        done, or when the platform refused: then the rest is left to first writes)."""
        if self.done:
            return 0
        started = time.perf_counter()
        end = min(self._num_blocks, self.backed + max(1, num_bytes // max(self._bytes_per_block, 1)))
        for cache in self._caches:
            if not self._back_blocks(cache, self._block_dim, self.backed, end):
                logger.debug("KV cache pages left to first writes: the platform cannot back them")
                self.backed = self._num_blocks
                return 0
        backed_bytes = (end - self.backed) * self._bytes_per_block
        self.backed = end
        self.seconds += time.perf_counter() - started
        return backed_bytes
