"""SmallBatchLinear: the CPU's own float32 matrix products, which oneDNN linear hands its rows to first.

Up to ``SMALL_BATCH_ROWS`` rows stream the float32 weight once at memory speed
(``kernels/small_batch_matmul.c``, AVX-512 or AVX2 with FMA builds); from there to ``PANEL_MAX_ROWS``
rows ``PanelMatmul`` multiplies against packed weight panels. With bf16x3 on (``SplitBf16Matmul``, AMX,
``TOKENMILL_CPU_FP32_MATMUL``) every product of more rows is split, so such a weight is covered at
every row count and oneDNN's reordered copy of it would never be read. Being native calls, they also
let a dense model's decode steps be captured as CPU decode graphs.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from tokenmill.plugin_api.native import build_native_library, native_call
from tokenmill_cpu.panel_matmul import PanelMatmul, float32_matrices
from tokenmill_cpu.split_bf16_matmul import SplitBf16Matmul

SOURCE = Path(__file__).parent / "kernels" / "small_batch_matmul.c"
FLOAT32 = torch.float32
SMALL_BATCH_ROWS = 2


@lru_cache(maxsize=1)
def load_small_batch_matmul() -> Any:
    """``small_batch_matmul_f32`` from its compiled library, with ``offered`` (False where oneDNN stays:
    builds with neither AVX-512 nor AVX2 + FMA); NativeBuildError when there is no C compiler."""
    library = build_native_library(SOURCE, "CPU small-batch matmul")
    function = library.small_batch_matmul_f32
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [pointer, i64, i64, i64, pointer, i64, i64, pointer, i64]
    function.restype = None
    library.small_batch_matmul_offered.restype = ctypes.c_int
    function.offered = bool(library.small_batch_matmul_offered())
    return function


class SmallBatchLinear:
    """``x @ weight.T`` for the float32 row counts the CPU's own kernels multiply faster than oneDNN."""

    def __init__(self, split_bf16: bool = False) -> None:
        """``split_bf16``: products of more than ``SMALL_BATCH_ROWS`` rows run in bf16x3 on AMX where the
        CPU has it (NativeBuildError from core when there is no C compiler)."""
        self._small_batch_matmul = load_small_batch_matmul()
        self._panel_matmul = PanelMatmul()
        split_matmul = SplitBf16Matmul() if split_bf16 else None
        self._split_matmul = split_matmul if split_matmul is not None and split_matmul.offered else None

    @property
    def split_bf16(self) -> bool:
        """Whether float32 products of more than ``SMALL_BATCH_ROWS`` rows run in bf16x3 on AMX."""
        return self._split_matmul is not None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """``x @ weight.T`` as a new [M, N] tensor for float32 rows ``x`` [M, K] and ``weight`` [N, K]: up to
        ``SMALL_BATCH_ROWS`` rows straight from the weight (AVX-512, or AVX2 with FMA); more rows in bf16x3
        on AMX when ``split_bf16`` (at every row count), else up to ``PANEL_MAX_ROWS`` against packed
        panels; None for the rest, other dtypes and layouts, and other CPUs (oneDNN's to run)."""
        if self._split_matmul is not None and self._split_matmul.accepts(x, weight) and x.shape[0] > SMALL_BATCH_ROWS:
            return self._split_matmul(x, weight)
        if x.shape[0] <= SMALL_BATCH_ROWS and self._small_batch_matmul.offered and float32_matrices(x, weight):
            rows, width = x.shape
            out = torch.empty(rows, weight.shape[0], dtype=FLOAT32)
            native_call(self._small_batch_matmul, x.data_ptr(), rows, width, x.stride(0), weight.data_ptr(),
                        weight.shape[0], weight.stride(0), out.data_ptr(), out.stride(0))
            return out
        return self._panel_matmul(x, weight) if self._panel_matmul.accepts(x, weight) else None

    def covers(self, weight: torch.Tensor) -> bool:
        """True for a float32 weight where bf16x3 on AMX is on: ``__call__`` then takes it at every row
        count (1-2 rows straight from it, more split), so oneDNN's copy of it would never be read."""
        if self._split_matmul is None or weight.dim() != 2:
            return False
        one_row = torch.empty(1, weight.shape[1], dtype=FLOAT32)  # the operand checks do not depend on the rows
        return self._split_matmul.accepts(one_row, weight) and self._panel_matmul.accepts(one_row, weight)
