"""GreedyHead: greedy decoding's argmax, and on CPUs with native bfloat16 dot products the argmax of
a float32 LM head without computing every float32 logit.

A greedy decode step of a small model spends a large share of its time in the LM head (SmolLM2-135M:
28 of its 134 M weights, 64 rows x 49152 logits) and then in ``torch.argmax`` over the result (3 ms
for 64 rows here, single-threaded). ``argmax_rows`` is that argmax in C over both cores.
``__call__`` multiplies a bfloat16 copy of the weight by the rows rounded to bfloat16 (oneDNN, on
AMX or AVX512-BF16, the weight reordered once: 6.4 ms against 25 ms for the float32 product and its
argmax at 64 rows, 4.7 against 5.2 ms at one, weights cold), bounds each estimate's
error, and recomputes in float32 only the tokens the bounds leave in contention (about two per row
on SmolLM2; ``kernels/greedy_head.c``). The token it returns is the float32 product's argmax up to
the float32 product's own rounding, which the bounds include.

The bound on one logit, with u = 2^-8 (bfloat16's unit roundoff) and g = K 2^-24 / (1 - K 2^-24)
(float32 sums of K products, for oneDNN's sum of the bfloat16 products and for the float32 product
the answer must agree with), is ``(2u + u^2 + 2g) |x| |w_j|`` for the rounded inputs and the sums,
plus ``u / (1 - u) |est_j|`` for the estimate's own rounding to bfloat16, each widened by 1 % for
the rounding of the norms and of the bounds themselves.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from tokenmill.layers.native_calls import native_call
from tokenmill.layers.native_library import build_native_library
from tokenmill.layers.onednn_linear import onednn_unavailable
from tokenmill_cpu.weight_copies import WeightCopies

SOURCE = Path(__file__).parent / "kernels" / "greedy_head.c"
FLOAT32, BFLOAT16 = torch.float32, torch.bfloat16
BF16_ROUNDOFF = 2.0 ** -8
BATCH_HINT = 64
SLACK = 1.01
TINY_NORM = 1e-15


@lru_cache(maxsize=1)
def load_greedy_head() -> ctypes.CDLL:
    """The compiled library (NativeBuildError from core when there is no C compiler)."""
    library = build_native_library(SOURCE, "CPU greedy head")
    pointer, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    library.argmax_rows_f32.argtypes = [pointer, i64, i64, i64, pointer]
    library.argmax_rows_f32.restype = None
    library.greedy_head_f32.argtypes = [pointer, i64, pointer, i64, pointer, i64, pointer, i64, i64, i64, f64, f64,
                                        pointer]
    library.greedy_head_f32.restype = i64
    return library


def error_bounds(depth: int) -> tuple[float, float]:
    """``(rel, out_rel)``: an estimate's error is at most ``rel |x| |w_j| + out_rel |est_j|``."""
    u = BF16_ROUNDOFF
    g = depth * 2.0 ** -24 / (1 - depth * 2.0 ** -24)
    return SLACK * (2 * u + u * u + 2 * g), SLACK * u / (1 - u)


def row_norms(weight: torch.Tensor) -> torch.Tensor:
    """The float32 Euclidean norm of each row of a float32 ``weight``, within the bounds' 1 % slack: summed
    in float32 (a relative error near K 2^-24), except rows whose squares may underflow (norms below
    ``TINY_NORM``), summed in float64. A float64 copy of the whole weight took 0.4 s at the first greedy
    step of a fresh server (SmolLM2's 49152 x 576 head), float32 sums take 5 ms."""
    norms = torch.linalg.vector_norm(weight, dim=1)
    tiny = norms < TINY_NORM
    if bool(tiny.any()):
        norms[tiny] = torch.linalg.vector_norm(weight[tiny].double(), dim=1).float()
    return norms


class _Estimator:
    """One weight's bfloat16 copy (reordered for oneDNN) and float32 row norms."""

    __slots__ = ("bf16", "norms")

    def __init__(self, weight: torch.Tensor) -> None:
        # reordered once for oneDNN: a plain bfloat16 weight is reordered at every call (64 rows: 11 ms, not 6)
        self.bf16 = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(BFLOAT16), BATCH_HINT)
        self.norms = row_norms(weight.detach())

    def estimate(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden @ weight.T`` in bfloat16 (inputs rounded to bfloat16, sums in float32)."""
        return torch.ops.mkldnn._linear_pointwise(hidden.to(BFLOAT16), self.bf16, None, "none", [], "")


class GreedyHead:
    """``argmax_rows(logits)`` and ``(hidden, weight) -> argmax of hidden @ weight.T`` per row."""

    def __init__(self, bf16_estimates: bool) -> None:
        self._library = load_greedy_head()
        self.bf16_estimates = bf16_estimates and onednn_unavailable() is None
        self._estimators: WeightCopies[_Estimator] = WeightCopies(_Estimator)

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor | None:
        """torch.argmax(logits, dim=-1) for float32 rows with a unit inner stride; None otherwise."""
        if logits.dtype is not FLOAT32 or logits.dim() != 2 or logits.stride(1) != 1 or logits.shape[1] == 0:
            return None
        out = torch.empty(logits.shape[0], dtype=torch.int64)
        native_call(self._library.argmax_rows_f32, logits.data_ptr(), logits.shape[0], logits.shape[1],
                    logits.stride(0), out.data_ptr())
        return out

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax of the float32 ``hidden @ weight.T`` (int64 [N]); None where bfloat16
        products are slow here, for other dtypes and layouts, or when a row is not finite."""
        if not self.bf16_estimates or hidden.dtype is not FLOAT32 or weight.dtype is not FLOAT32:
            return None
        if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] or hidden.shape[0] == 0:
            return None
        if hidden.stride(1) != 1 or weight.stride(1) != 1 or weight.device.type != "cpu":
            return None
        estimator = self._estimators(weight)
        estimate = estimator.estimate(hidden)
        rows, depth = hidden.shape
        rel, out_rel = error_bounds(depth)
        out = torch.empty(rows, dtype=torch.int64)
        unsettled = native_call(self._library.greedy_head_f32, estimate.data_ptr(), estimate.stride(0),
                                hidden.data_ptr(), hidden.stride(0), weight.data_ptr(), weight.stride(0),
                                estimator.norms.data_ptr(), rows, weight.shape[0], depth, rel, out_rel,
                                out.data_ptr())
        return None if unsettled else out
