"""Instruction-set features that change which dtype and kernels are fast on a CPU."""

from __future__ import annotations

from collections.abc import Iterable

# /proc/cpuinfo flag names, reported in this order. x86 first, then Arm ("Features" line).
FEATURES = (
    "fma",
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimdhp",
    "asimddp",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
)
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
NATIVE_FP16 = frozenset({"avx512_fp16", "amx_fp16", "asimdhp"})
INT8_DOT = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "i8mm", "asimddp"})


def isa_features(flags: Iterable[str]) -> tuple[str, ...]:
    """The features from ``FEATURES`` that ``flags`` contains, in ``FEATURES`` order."""
    present = set(flags)
    return tuple(feature for feature in FEATURES if feature in present)


def has_native_bf16(isa: Iterable[str]) -> bool:
    """bf16 dot-product instructions (AVX512-BF16, AMX-BF16, Arm BF16). Without them torch
    emulates bf16 matmul, which is about 100x slower than float32 on AVX2."""
    return bool(NATIVE_BF16 & set(isa))


def has_native_fp16(isa: Iterable[str]) -> bool:
    """fp16 arithmetic instructions (AVX512-FP16, AMX-FP16, Arm half-precision SIMD)."""
    return bool(NATIVE_FP16 & set(isa))


def has_int8_dot(isa: Iterable[str]) -> bool:
    """int8 dot-product instructions (VNNI, AMX-INT8, Arm I8MM/dotprod)."""
    return bool(INT8_DOT & set(isa))
