"""The element types the C kernels are built for, and the suffix of each one's function names
(``rms_norm_f32``, ``paged_decode_bf16``, ...)."""

from __future__ import annotations

from typing import Any

import torch

SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def by_dtype(library: Any, name: str) -> dict[torch.dtype, Any]:
    """``name``'s function in ``library`` for each dtype in ``SUFFIXES`` (``name_f32``, ``name_bf16``)."""
    return {dtype: getattr(library, f"{name}_{suffix}") for dtype, suffix in SUFFIXES.items()}
