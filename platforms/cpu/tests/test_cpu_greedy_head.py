"""GreedyHead: ``argmax_rows`` gives torch.argmax's answer (ties, NaNs, infinities, strided rows);
the greedy LM head gives the float32 product's argmax from bfloat16 estimates (int8 ones for one or
two rows, on every CPU), including near-ties the
estimates cannot see and exact ties (first index), declines what it cannot settle (non-finite
values) or take (dtypes, layouts, CPUs without native bfloat16), follows in-place weight changes,
and its error bound holds against the float64 product."""

from __future__ import annotations

import gc

import pytest
import torch

from tokenmill.plugin_api.native import build_failure
from tokenmill_cpu.greedy_head import (
    INT8_MAX_ROWS,
    SLACK,
    GreedyHead,
    error_bounds,
    load_greedy_head,
    row_norms,
)
from tokenmill_cpu.layer_kernels import CpuLayerKernels, layer_ops_unavailable

pytestmark = pytest.mark.skipif(build_failure(load_greedy_head) is not None, reason="no C compiler")


@pytest.fixture
def head() -> GreedyHead:
    return GreedyHead(bf16_estimates=True)


def _reference(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hidden @ weight.T).argmax(dim=-1)


@pytest.mark.parametrize("shape", [(1, 1), (1, 49152), (3, 17), (64, 1000), (5, 4099)])
def test_argmax_rows_matches_torch(head, shape):
    torch.manual_seed(shape[0] * 31 + shape[1])
    logits = torch.randn(shape)
    assert head.argmax_rows(logits).tolist() == logits.argmax(dim=-1).tolist()


def test_argmax_rows_ties_nans_and_infinities(head):
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [nan, 5.0, nan, 1.0], [-inf] * 4, [2.0, nan, 9.0, 1.0],
                           [inf, 1.0, inf, -inf], [0.0, -0.0, 0.0, -1.0]])
    got = head.argmax_rows(logits)
    assert got.dtype == torch.int64 and got.tolist() == logits.argmax(dim=-1).tolist()


def test_argmax_rows_reads_strided_rows_and_declines_other_layouts(head):
    torch.manual_seed(2)
    wide = torch.randn(6, 300)
    rows = wide[:, 7:207]
    assert head.argmax_rows(rows).tolist() == rows.argmax(dim=-1).tolist()
    assert head.argmax_rows(wide.T) is None  # inner stride not 1
    assert head.argmax_rows(wide.double()) is None
    assert head.argmax_rows(torch.randn(3)) is None


@pytest.mark.parametrize(("rows", "vocab", "depth"), [(1, 3000, 64), (7, 1000, 576), (64, 5003, 96), (2, 70, 1)])
def test_greedy_head_matches_the_float32_argmax(head, rows, vocab, depth):
    torch.manual_seed(rows + vocab + depth)
    hidden, weight = torch.randn(rows, depth) * 3, torch.randn(vocab, depth) * 0.05
    assert head(hidden, weight).tolist() == _reference(hidden, weight).tolist()


def test_greedy_head_separates_near_ties_below_bfloat16_precision(head):
    torch.manual_seed(3)
    depth = 128
    hidden = torch.rand(8, depth) + 0.5  # positive: scaling a weight row scales its logit
    others = torch.randn(500, depth) * 0.01
    base = torch.rand(depth) + 0.5
    for row, (first, second) in enumerate([(10, 400), (400, 10), (0, 499), (250, 251)] * 2):
        weight = others.clone()
        weight[first] = base
        weight[second] = base * (1 + (1e-4 if row % 2 else -1e-4))  # (nearly) the same bfloat16 row
        want = _reference(hidden[row:row + 1], weight)
        assert want.item() in (first, second)
        assert head(hidden[row:row + 1], weight).tolist() == want.tolist()


def test_greedy_head_takes_the_first_of_exact_ties(head):
    hidden = torch.ones(2, 16)
    weight = torch.zeros(40, 16)
    weight[[5, 9, 30]] = 1.0
    assert head(hidden, weight).tolist() == [5, 5]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_greedy_head_declines_rows_it_cannot_settle(head, bad):
    torch.manual_seed(4)
    hidden, weight = torch.randn(3, 32), torch.randn(100, 32)
    hidden[1, 5] = bad
    assert head(hidden, weight) is None
    hidden[1, 5] = 0.0
    weight[17, 3] = bad
    assert head(hidden, weight) is None


def test_greedy_head_declines_what_it_does_not_take():
    torch.manual_seed(5)
    hidden, weight = torch.randn(2, 32), torch.randn(50, 32)
    without_bf16 = GreedyHead(bf16_estimates=False)  # e.g. AVX2: bfloat16 products are slow
    assert without_bf16(torch.randn(INT8_MAX_ROWS + 1, 32), weight) is None  # more rows than int8 estimates take
    head = GreedyHead(bf16_estimates=True)
    assert head(hidden.bfloat16(), weight) is None
    assert head(hidden, weight.double()) is None
    assert head(hidden.T.contiguous().T, weight) is None  # inner stride not 1
    assert head(hidden[:, :16], weight) is None  # depths differ
    assert head(hidden[:0], weight) is None


def test_the_estimates_follow_the_weight(head):
    torch.manual_seed(6)
    hidden, weight = torch.randn(4, 64), torch.randn(300, 64)
    assert head(hidden, weight).tolist() == _reference(hidden, weight).tolist()
    assert len(head._estimators) == 1
    weight.neg_()  # in place: same storage, new version
    assert head(hidden, weight).tolist() == _reference(hidden, weight).tolist()
    del weight
    gc.collect()
    assert not head._estimators


@pytest.mark.parametrize("depth", [1, 64, 576, 2048])
def test_the_error_bound_holds(head, depth):
    torch.manual_seed(depth)
    hidden, weight = torch.randn(16, depth) * 4, torch.randn(2000, depth) * 0.1
    weight[:100] *= 30  # rows of very different norms
    estimate = head._estimators(weight).estimate(hidden).double()
    exact = hidden.double() @ weight.double().T
    rel, out_rel = error_bounds(depth)
    bound = rel * hidden.double().norm(dim=1, keepdim=True) * weight.double().norm(dim=1) + out_rel * estimate.abs()
    assert bool(((estimate - exact).abs() <= bound).all())
    assert float(((estimate - exact).abs() / bound).max()) > 0.01  # and is not vacuous


@pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler")
def test_the_layer_kernels_offer_both():
    torch.manual_seed(7)
    kernels = CpuLayerKernels(bf16_estimates=True)
    hidden, weight = torch.randn(3, 48), torch.randn(700, 48)
    assert kernels.greedy_lm_head(hidden, weight).tolist() == _reference(hidden, weight).tolist()
    logits = hidden @ weight.T
    assert kernels.argmax_rows(logits).tolist() == logits.argmax(dim=-1).tolist()
    assert CpuLayerKernels().greedy_lm_head(hidden, weight) is None


def test_row_norms_are_the_float64_norms_even_where_squares_underflow():
    torch.manual_seed(0)
    weight = torch.randn(300, 576) * 0.05
    weight[7] = 1e-24  # squares below float32's smallest subnormal: summed in float64
    weight[8] = 0.0
    weight[8, :3] = torch.tensor([3e-30, -4e-30, 0.0])
    want = torch.linalg.vector_norm(weight.double(), dim=1)
    got = row_norms(weight)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=0)
    assert got[7] > 0 and got[8].item() == pytest.approx(5e-30, rel=1e-5)


@pytest.mark.parametrize("rows", range(1, INT8_MAX_ROWS + 1))
@pytest.mark.parametrize(("vocab", "depth"), [(3000, 64), (1000, 576), (70, 1), (49152, 16)])
def test_int8_estimates_need_no_bfloat16(rows, vocab, depth):
    torch.manual_seed(rows * vocab + depth)
    hidden, weight = torch.randn(rows, depth) * 3, torch.randn(vocab, depth) * 0.05
    weight[: vocab // 10] *= 40  # rows of very different scales
    weight[vocab // 2] = 0.0  # an all-zero row
    assert GreedyHead(bf16_estimates=False)(hidden, weight).tolist() == _reference(hidden, weight).tolist()


@pytest.mark.parametrize("depth", [1, 64, 576, 2048])
def test_the_int8_error_bound_holds(depth):
    torch.manual_seed(depth)
    head = GreedyHead(bf16_estimates=False)
    hidden, weight = torch.randn(INT8_MAX_ROWS, depth) * 4, torch.randn(2000, depth) * 0.1
    weight[:100] *= 30
    weight[100, : depth // 2 + 1] = 1e-3  # a row whose int8 steps are coarse for its small entries
    estimator = head._int8(weight)
    estimate = estimator.estimate(head._library, hidden).double()
    exact = hidden.double() @ weight.double().T
    bound = SLACK * hidden.double().norm(dim=1, keepdim=True) * estimator.bounds.double() \
        + SLACK * 2.0 ** -24 * estimate.abs()
    assert bool(((estimate - exact).abs() <= bound).all())
    assert float(((estimate - exact).abs() / bound).max()) > 0.01  # and is not vacuous
    assert head._int8(weight) is estimator and len(head._int8) == 1
    weight.neg_()  # in place: the int8 copy is made again
    assert head(hidden, weight).tolist() == _reference(hidden, weight).tolist()


@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_int8_estimates_of_other_builds(build_for_march, march):
    """The AVX2 block and the portable one (x86-64 baseline) against the float64 product of the int8 rows."""
    from tokenmill_cpu.greedy_head import INT8_LANES, SOURCE, Int8Estimator

    library = build_for_march(SOURCE, march, load_greedy_head())
    torch.manual_seed(8)
    weight = torch.randn(INT8_LANES * 7 + 5, 100) * 0.05  # a ragged last block
    estimator = Int8Estimator(weight)
    for rows in range(1, INT8_MAX_ROWS + 1):
        hidden = torch.randn(rows, 100)
        rows_q = estimator.q.transpose(1, 2).reshape(-1, 100)[: weight.shape[0]].double()
        want = hidden.double() @ rows_q.T * estimator.scales[: weight.shape[0]].double()
        got = estimator.estimate(library, hidden)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_int8_estimates_decline_what_they_cannot_settle(bad):
    torch.manual_seed(9)
    head = GreedyHead(bf16_estimates=False)
    hidden, weight = torch.randn(1, 32), torch.randn(100, 32)
    weight[17, 3] = bad  # the row's scale is not finite: so is its estimate
    assert head(hidden, weight) is None
    weight[17, 3] = 0.0
    hidden[0, 5] = bad
    assert head(hidden, weight) is None
