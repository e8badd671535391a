"""KvCachePages: backing a CPU KV cache's memory before the first writes would, block by block.

A CPU cache is a fresh anonymous mapping (``zeroed_tensor``): each page is backed on its first write,
in the middle of a step. In a VM that first touch is expensive: SmolLM2's W1 (64 x 128 decode tokens,
754 MB of cache) spent 5-9 % of its run in the kernel's page clearing, and first-touching 1 GiB took
0.7-4 s on a 2-core KVM guest, where asking the kernel to populate the same range up front
(``MADV_POPULATE_WRITE``, Linux 5.14+) took 2-3x less. The block pool hands out never-used blocks
in block order, so backing blocks ``[0, n)`` of every layer covers the first ``n`` blocks the engine
will use: an engine backs ``STARTUP_BYTES`` of them when it is built (0.7-4.5 s per GiB on that
guest, depending on the host), and a server the rest, a chunk at a time, while it is idle. A server
that left all of it to idle time answered 2-3 s sooner, but a burst arriving right away (a benchmark
client, ~8 s later, while the client's own start still held a core) found most pages unbacked: its
steps ran ~30 % slower (64 x 128/128 requests: 2048-token prefill steps 1.5-1.7 s against 1.2, decode
steps 77-89 ms against 58-61). Where the kernel or the tensor does not allow it (GPU memory, older
kernels), nothing happens and pages are backed on first write as before.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import time
from collections.abc import Iterator

import torch

logger = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23
STARTUP_BYTES = 1 << 30  # backed when an engine is built: SmolLM2's 64 x 256-token batch needs 754 MB
IDLE_CHUNK_BYTES = 16 << 20  # backed per idle turn of a server: a request arriving meanwhile waits for it


def _madvise() -> ctypes._CFuncPtr | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _spans(tensor: torch.Tensor, block_dim: int) -> Iterator[tuple[int, int]]:
    """(address, bytes) of the contiguous runs of ``tensor``, a slice along ``block_dim`` of a
    contiguous cache: one run per index of the dimensions before it."""
    if block_dim == 0:
        yield tensor.data_ptr(), tensor.numel() * tensor.element_size()
        return
    for part in tensor.unbind(0):
        yield from _spans(part, block_dim - 1)


class KvCachePages:
    """Backs blocks ``[0, n)`` of every layer's cache on request, remembering how far it got."""

    def __init__(self, caches: list[torch.Tensor], block_dim: int, num_blocks: int) -> None:
        self._caches = [c for c in caches if c.device.type == "cpu" and c.is_contiguous() and c.numel()]
        self._block_dim = block_dim
        self._num_blocks = num_blocks
        self._bytes_per_block = sum(c.numel() * c.element_size() for c in self._caches) // max(num_blocks, 1)
        self._madvise = _madvise() if self._caches else None
        self.backed = 0 if self._madvise is not None else num_blocks  # blocks [0, backed) are backed
        self.seconds = 0.0  # spent in calls of ``back`` that backed blocks

    @property
    def done(self) -> bool:
        """Whether every block is backed (or backing is not possible here)."""
        return self.backed >= self._num_blocks

    def back(self, num_bytes: int) -> int:
        """Back the next ``num_bytes`` worth of blocks (all layers); returns the bytes backed (0 when
        done, or when the kernel refused: then the rest is left to first writes)."""
        if self.done:
            return 0
        started = time.perf_counter()
        end = min(self._num_blocks, self.backed + max(1, num_bytes // max(self._bytes_per_block, 1)))
        page = mmap.PAGESIZE
        for cache in self._caches:
            for address, length in _spans(cache.narrow(self._block_dim, self.backed, end - self.backed),
                                          self._block_dim):
                start = address - address % page
                if self._madvise(start, address + length - start, MADV_POPULATE_WRITE) != 0:
                    logger.debug("KV cache pages left to first writes: madvise errno %d", ctypes.get_errno())
                    self.backed = self._num_blocks
                    return 0
        backed_bytes = (end - self.backed) * self._bytes_per_block
        self.backed = end
        self.seconds += time.perf_counter() - started
        return backed_bytes
