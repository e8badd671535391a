"""The CPU attention kernels: ``paged_decode.c`` (decode, the step's cache write included) and
``paged_prefill.c`` (prefill chunks and their cache write), each for float32 and bfloat16, compiled
once per machine and called through ctypes.

Built and cached by core's ``build_native_library``; without a C compiler the kernels are unavailable
and the CPU platform falls back to the plain-PyTorch attention (with that reason).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

from tokenmill.plugin_api.native import build_failure, build_native_library
from tokenmill_cpu.kernels.dtypes import SUFFIXES

DECODE_SOURCE = Path(__file__).with_name("paged_decode.c")
PREFILL_SOURCE = Path(__file__).with_name("paged_prefill.c")
MAX_HEAD_SIZE = 256
MAX_GROUP = 64


@lru_cache(maxsize=1)
def load_library() -> SimpleNamespace:
    """The kernels by name (``paged_decode_f32``, ``paged_prefill_bf16``, ``write_kv_f32``, ...), built on
    first use; NativeBuildError (core) with the compiler's message otherwise."""
    decode = build_native_library(DECODE_SOURCE, "CPU decode attention kernel")
    prefill = build_native_library(PREFILL_SOURCE, "CPU prefill attention kernel")
    pointer, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    functions = {}
    for suffix in SUFFIXES.values():
        functions[f"paged_decode_{suffix}"] = _typed(getattr(decode, f"paged_decode_{suffix}"),
                                                     [pointer] * 5 + [i64] * 7 + [f32, i64, f32] + [pointer, i64] * 2
                                                     + [pointer], None)
        functions[f"paged_prefill_{suffix}"] = _typed(getattr(prefill, f"paged_prefill_{suffix}"),
                                                      [pointer] * 6 + [i64] * 7 + [f32, i64, f32], None)
        functions[f"write_kv_{suffix}"] = _typed(getattr(prefill, f"write_kv_{suffix}"),
                                                 [pointer] + [i64] * 3 + [pointer, i64] * 2 + [pointer, i64], i64)
    return SimpleNamespace(**functions)


def _typed(function, argtypes: list, restype):
    function.argtypes, function.restype = argtypes, restype
    return function


def unavailable_reason() -> str | None:
    """Why the native kernels cannot be used here, or None."""
    return build_failure(load_library)
