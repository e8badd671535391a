"""back_blocks: backing pages of a CPU KV cache before the first writes would (``MADV_POPULATE_WRITE``).

A cache from ``zeroed_tensor`` is a fresh anonymous mapping: each page is backed on its first write, in
the middle of a step, and in a VM that first touch is expensive. Asking the kernel to populate a range
up front (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+) costs less than first-touching it and keeps
the page clearing out of the steps. It never changes what the pages hold. Where the kernel or the
tensor does not allow it (older kernels, other systems, a non-contiguous tensor), ``back_blocks``
says so and pages are backed on first write.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from collections.abc import Iterator
from functools import lru_cache

import torch

logger = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23


@lru_cache(maxsize=1)
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


def back_blocks(cache: torch.Tensor, block_dim: int, start: int, stop: int) -> bool:
    """Populate the pages of blocks ``[start, stop)`` (along ``block_dim``) of a contiguous CPU ``cache``;
    False when this kernel or this tensor does not allow it."""
    madvise = _madvise()
    if madvise is None or cache.device.type != "cpu" or not cache.is_contiguous():
        return False
    page = mmap.PAGESIZE
    for address, length in _spans(cache.narrow(block_dim, start, stop - start), block_dim):
        first = address - address % page
        if madvise(first, address + length - first, MADV_POPULATE_WRITE) != 0:
            logger.debug("madvise(MADV_POPULATE_WRITE) failed: errno %d", ctypes.get_errno())
            return False
    return True
