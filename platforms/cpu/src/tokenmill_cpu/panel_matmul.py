"""PanelMatmul: float32 decode-batch matrix products against weights packed once into column panels.

``kernels/panel_matmul.c`` (AVX-512) multiplies up to ``PANEL_MAX_ROWS`` rows of activations by a
weight repacked into panels of 48 output columns, read in depth order: the shape of a decode step
(a few to a few hundred rows against every weight of the model). Measured on a 2-core AVX-512 Xeon
against oneDNN's reordered-weight linear over 30 cold SmolLM2-135M layers: 6-22 % faster at 64 rows
(both vary by 30 % from run to run there), even at 128 to 256; at 1024 rows and more oneDNN (or
MKL) is faster, so prefill keeps it. Being a native call, it also lets decode steps of every batch
size be captured as CPU decode graphs.

The packed form is a second copy of each weight it has multiplied (made at the first call, about
the size of the float32 weight), kept while the weight lives and made again when the weight
changes in place.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from tokenmill.plugin_api.native import build_native_library, native_call
from tokenmill_cpu.weight_copies import WeightCopies

SOURCE = Path(__file__).parent / "kernels" / "panel_matmul.c"
FLOAT32 = torch.float32
PANEL_MAX_ROWS = 256


@lru_cache(maxsize=1)
def load_panel_matmul() -> ctypes.CDLL:
    """The compiled library (NativeBuildError from core when there is no C compiler)."""
    library = build_native_library(SOURCE, "CPU panel matmul")
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    library.pack_panels_f32.argtypes = [pointer, i64, i64, i64, pointer]
    library.pack_panels_f32.restype = None
    library.panel_matmul_f32.argtypes = [pointer, i64, i64, i64, pointer, i64, pointer, i64]
    library.panel_matmul_f32.restype = None
    library.panel_matmul_packed_size.argtypes = [i64, i64]
    library.panel_matmul_packed_size.restype = i64
    library.panel_matmul_offered.restype = ctypes.c_int
    return library


def float32_matrices(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x`` [M, K] (M > 0) and ``weight`` [N, K] are float32 CPU matrices with unit inner strides,
    the operands the native float32 products take."""
    return (x.dtype is FLOAT32 and weight.dtype is FLOAT32 and x.dim() == 2 and weight.dim() == 2
            and x.shape[0] > 0 and weight.shape[1] == x.shape[1] and x.stride(1) == 1 and weight.stride(1) == 1
            and x.device.type == "cpu")


class PanelMatmul:
    """``x @ weight.T`` for 1..PANEL_MAX_ROWS float32 rows, with each weight packed at its first use."""

    def __init__(self) -> None:
        self._library = load_panel_matmul()
        self.offered = bool(self._library.panel_matmul_offered())
        self._packed: WeightCopies[torch.Tensor] = WeightCopies(self._pack)

    def accepts(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether ``__call__`` takes these operands (``float32_matrices``, up to ``PANEL_MAX_ROWS`` rows)."""
        return self.offered and float32_matrices(x, weight) and x.shape[0] <= PANEL_MAX_ROWS

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` as a new [M, N] tensor (operands as ``accepts`` requires)."""
        panels = self.panels(weight)
        rows, depth = x.shape
        out = torch.empty(rows, weight.shape[0], dtype=FLOAT32)
        native_call(self._library.panel_matmul_f32, x.data_ptr(), rows, depth, x.stride(0), panels.data_ptr(),
                    weight.shape[0], out.data_ptr(), out.stride(0))
        return out

    def panels(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` packed (cached while it lives and stays unchanged)."""
        return self._packed(weight)

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        n, k = weight.shape
        panels = torch.empty(self._library.panel_matmul_packed_size(n, k), dtype=FLOAT32)
        self._library.pack_panels_f32(weight.data_ptr(), n, k, weight.stride(0), panels.data_ptr())
        return panels
