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

Steps of one or two rows (decoding a request or two: memory-bound, every weight read once a token) take
estimates from an int8 copy of the head instead, on every CPU (``Int8Estimator``): rows q_j = round(w_j / s_j)
with s_j = max |w_j| / 127, a quarter of the float32 head's bytes and half the bfloat16 copy's. With
e_j = w_j - s_j q_j the estimate s_j (x . q_j) is off by at most ``|x| |e_j|`` plus the float32 sums'
``g |x| (s_j |q_j| + |w_j|)`` and the final product's rounding, so ``|e_j| + g (s_j |q_j| + |w_j|)``,
computed in float64 when the copy is made, takes the place of ``|w_j|`` in the bound below.
The int8 copy is read in blocks of 16 tokens interleaved by depth (one load serves 16 logits, no sum is
reduced across lanes) with software prefetch four blocks ahead: 1.3 ms a token for SmolLM2's head against
2.5 for the bfloat16 estimate, cold. SmolLM2's float32 W2 decode, alternating runs: 54.2 -> 58.9 and
53.5 -> 57.4 tok/s, same output.

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

from tokenmill.plugin_api.native import build_native_library, native_call
from tokenmill_cpu.onednn_linear import onednn_unavailable
from tokenmill_cpu.weight_copies import WeightCopies

SOURCE = Path(__file__).parent / "kernels" / "greedy_head.c"
FLOAT32, BFLOAT16 = torch.float32, torch.bfloat16
BF16_ROUNDOFF = 2.0 ** -8
BATCH_HINT = 64
SLACK = 1.01
TINY_NORM = 1e-15
INT8_MAX_ROWS = 2  # more rows multiply the bfloat16 copy on AMX / AVX512-BF16, or take every logit
INT8_PACK_ROWS = 4096  # head rows quantised at a time (float64 temporaries stay small)
INT8_LANES = 16  # tokens a block of the int8 copy interleaves (kernels/greedy_head.c's LANES)
FLOAT32_ROUNDOFF = 2.0 ** -24


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
    library.greedy_head_f32_est_f32.argtypes = library.greedy_head_f32.argtypes
    library.greedy_head_f32_est_f32.restype = i64
    library.int8_estimate_f32.argtypes = [pointer, i64, i64, pointer, pointer, i64, i64, pointer, i64]
    library.int8_estimate_f32.restype = None
    return library


def _sums_roundoff(depth: int) -> float:
    """g: the relative error bound of a float32 sum of ``depth`` products, in any order."""
    return depth * FLOAT32_ROUNDOFF / (1 - depth * FLOAT32_ROUNDOFF)


def error_bounds(depth: int) -> tuple[float, float]:
    """``(rel, out_rel)``: an estimate's error is at most ``rel |x| |w_j| + out_rel |est_j|``."""
    u = BF16_ROUNDOFF
    g = _sums_roundoff(depth)
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


class Int8Estimator:
    """One weight's int8 rows and scales, and each row's coefficient of ``|x|`` in the estimate's error
    bound (``|e_j| + g (s_j |q_j| + |w_j|)``, see the module docstring)."""

    __slots__ = ("bounds", "q", "scales", "vocab")

    def __init__(self, weight: torch.Tensor) -> None:
        vocab, depth = weight.shape
        padded = -(-vocab // INT8_LANES) * INT8_LANES
        rows = torch.zeros(padded, depth, dtype=torch.int8)
        self.scales = torch.ones(padded, dtype=FLOAT32)
        self.bounds = torch.empty(vocab, dtype=FLOAT32)
        g = _sums_roundoff(depth)
        for start in range(0, vocab, INT8_PACK_ROWS):
            end = min(start + INT8_PACK_ROWS, vocab)
            w = weight.detach()[start:end].double()
            scales = (w.abs().amax(dim=1) / 127).float()
            scales[scales == 0] = 1.0
            q = torch.round(w / scales.double()[:, None]).clamp_(-127, 127)
            error = (w - scales.double()[:, None] * q).norm(dim=1)  # exact: s q and w - s q fit in float64
            bound = error + g * (scales.double() * q.norm(dim=1) + w.norm(dim=1))
            rows[start:end] = q.to(torch.int8)
            self.scales[start:end] = scales
            self.bounds[start:end] = (bound * (1 + 2 ** -20)).float()  # rounded up
        # blocks of INT8_LANES tokens, depth-major within a block: one load serves INT8_LANES logits
        self.q = rows.view(padded // INT8_LANES, INT8_LANES, depth).transpose(1, 2).contiguous()
        self.vocab = vocab

    def estimate(self, library: ctypes.CDLL, hidden: torch.Tensor) -> torch.Tensor:
        """``s_j (x . q_j)`` for every token, float32 [rows, vocab]."""
        rows, depth = hidden.shape
        out = torch.empty(rows, self.vocab, dtype=FLOAT32)
        native_call(library.int8_estimate_f32, hidden.data_ptr(), rows, hidden.stride(0), self.q.data_ptr(),
                    self.scales.data_ptr(), self.vocab, depth, out.data_ptr(), out.stride(0))
        return out


class GreedyHead:
    """``argmax_rows(logits)`` and ``(hidden, weight) -> argmax of hidden @ weight.T`` per row."""

    def __init__(self, bf16_estimates: bool) -> None:
        self._library = load_greedy_head()
        self.bf16_estimates = bf16_estimates and onednn_unavailable() is None
        self._estimators: WeightCopies[_Estimator] = WeightCopies(_Estimator)
        self._int8: WeightCopies[Int8Estimator] = WeightCopies(Int8Estimator)

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor | None:
        """torch.argmax(logits, dim=-1) for float32 rows with a unit inner stride; None otherwise."""
        if logits.dtype is not FLOAT32 or logits.dim() != 2 or logits.stride(1) != 1 or logits.shape[1] == 0:
            return None
        out = torch.empty(logits.shape[0], dtype=torch.int64)
        native_call(self._library.argmax_rows_f32, logits.data_ptr(), logits.shape[0], logits.shape[1],
                    logits.stride(0), out.data_ptr())
        return out

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax of the float32 ``hidden @ weight.T`` (int64 [N]): from int8 estimates for up
        to ``INT8_MAX_ROWS`` rows, else from bfloat16 ones; None for more rows where bfloat16 products are
        slow here, for other dtypes and layouts, or when a row is not finite."""
        if hidden.dtype is not FLOAT32 or weight.dtype is not FLOAT32:
            return None
        if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] or hidden.shape[0] == 0:
            return None
        if hidden.stride(1) != 1 or weight.stride(1) != 1 or weight.device.type != "cpu":
            return None
        if hidden.shape[0] <= INT8_MAX_ROWS:
            return self._settle_int8(hidden, weight)
        if not self.bf16_estimates:
            return None
        estimator = self._estimators(weight)
        rel, out_rel = error_bounds(hidden.shape[1])
        return self._settle(self._library.greedy_head_f32, estimator.estimate(hidden), hidden, weight,
                            estimator.norms, rel, out_rel)

    def _settle_int8(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        estimator = self._int8(weight)
        out_rel = SLACK * FLOAT32_ROUNDOFF / (1 - FLOAT32_ROUNDOFF)  # the product by s_j
        return self._settle(self._library.greedy_head_f32_est_f32, estimator.estimate(self._library, hidden), hidden,
                            weight, estimator.bounds, SLACK, out_rel)

    @staticmethod
    def _settle(function, estimate: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, norms: torch.Tensor,
                rel: float, out_rel: float) -> torch.Tensor | None:
        """Each row's argmax from ``estimate`` and its error bound ``rel |x| norms_j + out_rel |est_j|``
        (``kernels/greedy_head.c``), or None when a row could not be settled."""
        rows, depth = hidden.shape
        out = torch.empty(rows, dtype=torch.int64)
        unsettled = native_call(function, estimate.data_ptr(), estimate.stride(0), hidden.data_ptr(), hidden.stride(0),
                                weight.data_ptr(), weight.stride(0), norms.data_ptr(), rows, weight.shape[0], depth,
                                rel, out_rel, out.data_ptr())
        return None if unsettled else out
