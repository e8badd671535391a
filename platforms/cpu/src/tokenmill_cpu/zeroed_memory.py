"""zeroed_tensor: ``torch.zeros`` that writes nothing, for the multi-GiB CPU KV cache.

``torch.zeros`` fills every byte, which for a cache sized from free RAM costs seconds of every start.
Anonymous memory from the OS already reads as zeros and is backed page by page on first write, so the
cache is an anonymous mapping (page-aligned) viewed as a tensor: free to allocate, resident only as far
as it is used (or as ``kv_cache_pages.back_blocks`` backs it ahead). The mapping is private (a shared
anonymous mapping is shmem, which paged attention reads more slowly), without transparent huge pages
(their first touch is slow in VMs).
"""

from __future__ import annotations

import math
import mmap

import torch


def zeroed_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros over a fresh anonymous mapping instead of written zeros."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)
