"""Keeping freed activation memory in the process, so large tensors stop page-faulting every step.

glibc's malloc serves blocks above its mmap threshold (128 KiB at first) with fresh ``mmap`` pages
and gives them back on free; a 2048-token prefill allocates dozens of 5-25 MB activations per layer,
and touching every fresh page of each cost as much as the matmuls (the first prefill chunk took
2.4x the second). Raising the mmap threshold to its maximum and never trimming the heap keeps that
memory mapped for reuse (trimmed only past 2 GiB free), which is what LD_PRELOADing tcmalloc or jemalloc achieves for vLLM-CPU.
The process keeps its peak heap instead of returning it, which an inference server does anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MAX_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit: HEAP_MAX_SIZE / 2
TRIM_THRESHOLD = 2**31 - 1  # the largest int mallopt takes: the heap is trimmed only past 2 GiB free
OPT_OUT = "TOKENMILL_CPU_KEEP_MALLOC"  # "1": leave the allocator's settings alone


def tune_host_allocator() -> str:
    """Apply the settings once per process; returns what was done (for the startup log)."""
    if os.environ.get(OPT_OUT) == "1":
        return f"allocator left alone ({OPT_OUT}=1)"
    if not sys.platform.startswith("linux"):
        return "allocator left alone (not Linux)"
    libc = _glibc()
    if libc is None:
        return "allocator left alone (not glibc)"
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "allocator left alone (mallopt refused)"
    return (f"glibc malloc keeps freed memory for reuse (mmap threshold {MAX_MMAP_THRESHOLD >> 20} MiB, "
            f"trim above {round(TRIM_THRESHOLD / (1 << 30))} GiB)")


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
    except (OSError, AttributeError):
        return None
    return libc
