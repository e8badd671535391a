"""GPTQ's solver (Frantar et al., 2022) for any rounding grid: quantize a weight column by column,
spreading each column's rounding error over the columns not yet quantized through the inverse
Hessian of the layer's inputs, so the layer's *outputs* on calibration data change as little as
possible. Integer formats (GPTQ) and float ones (fp8) differ only in how a column is rounded.

``H = 2/n * X^T X`` over the ``n`` calibration rows ``X`` that reached the layer. With ``U`` the
upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``, column ``i``'s error
``(w_i - q_i) / U[i, i]`` is subtracted from each later column ``j`` as ``err * U[i, j]``; updates
reach columns outside the current block of 128 lazily (the paper's batching). With ``act_order``
the columns are processed in decreasing ``diag(H)``. Columns whose input was always zero are
dropped (``diag(H) = 0``): they are rounded from zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

BLOCK_COLUMNS = 128

# round_column(position, values, pending) -> rounded values: ``position`` counts columns in processing
# order, ``values`` [out] is the column after the error updates so far, ``pending(n)`` [out, n] the
# current values of the next ``n`` columns from this one (for grids whose parameters are set per group).
RoundColumn = Callable[[int, torch.Tensor, Callable[[int], torch.Tensor]], torch.Tensor]


class HessianAccumulator:
    """``2/n * X^T X`` over every row of every batch ``add``-ed (a running mean, in float32)."""

    def __init__(self, columns: int) -> None:
        self.matrix = torch.zeros(columns, columns)
        self.rows = 0

    def add(self, inputs: torch.Tensor) -> None:
        """Accumulate a batch of layer inputs ``[..., columns]``."""
        x = inputs.detach().reshape(-1, self.matrix.shape[0]).to(torch.float32)
        self.add_product(x.T @ x, x.shape[0])

    def add_product(self, product: torch.Tensor, rows: int) -> None:
        """Accumulate ``X^T X`` of ``rows`` inputs computed elsewhere (shared by layers fed the same ``X``)."""
        total = self.rows + rows
        self.matrix *= self.rows / total
        self.matrix += product * (2.0 / total)
        self.rows = total


def column_order(hessian: torch.Tensor, act_order: bool) -> torch.Tensor:
    """The processing order of the columns: decreasing ``diag(H)`` with act order, else natural."""
    columns = hessian.shape[0]
    return torch.argsort(torch.diag(hessian), descending=True) if act_order else torch.arange(columns)


def quantize_with_error_feedback(weight: torch.Tensor, hessian: torch.Tensor, round_column: RoundColumn,
                                 order: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """The rounded weight [out, in] (float32, original column order) after rounding the columns of
    ``weight`` in ``order`` with ``round_column`` against ``hessian`` [in, in]."""
    w = weight.detach().to(torch.float32).clone()
    in_features = w.shape[1]
    if hessian.shape != (in_features, in_features):
        raise ValueError(f"Hessian {tuple(hessian.shape)} does not match a weight with {in_features} inputs")
    if not 0 < damp < 1:
        raise ValueError(f"damping {damp} must lie in (0, 1)")
    with one_thread():
        h = hessian.to(torch.float32).clone()
        dead = torch.diag(h) == 0
        h[dead, dead] = 1
        w[:, dead] = 0
        w, h = w[:, order], h[order][:, order]
        h += damp * torch.diag(h).mean() * torch.eye(in_features)
        inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
        rounded = torch.zeros_like(w)
        _solve(w, inverse, rounded, round_column)
        return rounded[:, torch.argsort(order)]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread inside the block. The solver's small matrices and thousands of
    per-column ops gain nothing from threads, and with several OpenMP threads on a busy machine each op
    can stall waiting for a descheduled thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _solve(w: torch.Tensor, inverse: torch.Tensor, rounded: torch.Tensor, round_column: RoundColumn) -> None:
    in_features = w.shape[1]
    for start in range(0, in_features, BLOCK_COLUMNS):
        end = min(start + BLOCK_COLUMNS, in_features)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        block_inverse = inverse[start:end, start:end]
        for i in range(end - start):
            def pending(count: int, i: int = i, block: torch.Tensor = block, end: int = end,
                        first: int = start) -> torch.Tensor:
                return torch.cat([block[:, i : i + count], w[:, end : first + i + count]], dim=1)

            column = round_column(start + i, block[:, i], pending)
            rounded[:, start + i] = column
            error = (block[:, i] - column) / block_inverse[i, i]
            block[:, i:] -= error[:, None] * block_inverse[i, i:][None, :]
            errors[:, i] = error
        w[:, end:] -= errors @ inverse[start:end, end:]
