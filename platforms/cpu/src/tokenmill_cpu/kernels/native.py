"""The CPU attention kernels ``paged_attention.c`` (float32 and bfloat16 decode, float32 prefill and
the prefill's cache write), compiled once per machine and called through ctypes.

Built and cached by core's ``build_native_library``; without a C compiler the kernel is unavailable
and the CPU platform falls back to the plain-PyTorch attention (with that reason).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

from tokenmill.layers.native_library import build_failure, build_native_library

SOURCE = Path(__file__).with_name("paged_attention.c")
MAX_HEAD_SIZE = 256
MAX_GROUP = 64


@lru_cache(maxsize=1)
def load_library() -> ctypes.CDLL:
    """The compiled library (built on first use); NativeBuildError (core) with the compiler's message otherwise."""
    library = build_native_library(SOURCE, "CPU attention kernel")
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    for function in (library.paged_decode_f32, library.paged_decode_bf16):
        function.argtypes = [pointer] * 5 + [i64] * 7 + [ctypes.c_float, i64, ctypes.c_float, pointer, i64, pointer,
                                                           i64, pointer]
        function.restype = None
    prefill = library.paged_prefill_f32
    prefill.argtypes = [pointer] * 6 + [i64] * 7 + [ctypes.c_float, i64, ctypes.c_float]
    prefill.restype = None
    write = library.write_kv_f32
    write.argtypes = [pointer] + [i64] * 3 + [pointer, i64, pointer, i64, pointer, i64]
    write.restype = i64
    return library


def unavailable_reason() -> str | None:
    """Why the native kernels cannot be used here, or None."""
    return build_failure(load_library)
