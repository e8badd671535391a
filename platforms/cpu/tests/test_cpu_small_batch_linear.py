"""SmallBatchLinear, the CPU's own float32 products that its oneDNN linear hands rows to first: one or
two rows straight from the weight (AVX-512 and AVX2 + FMA builds), against the float64 product, on
strided operands; what it declines goes to oneDNN; with bf16x3 it covers a float32 weight at every
row count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenmill_cpu.layer_kernels import layer_ops_unavailable
from tokenmill_cpu.panel_matmul import PANEL_MAX_ROWS
from tokenmill_cpu.small_batch_linear import SMALL_BATCH_ROWS, SOURCE, SmallBatchLinear, load_small_batch_matmul

pytestmark = pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the layer kernels")


@pytest.fixture(scope="module")
def small_batch_linear() -> SmallBatchLinear:
    return SmallBatchLinear()


SMALL_BATCH = pytest.mark.skipif(layer_ops_unavailable() is not None or not load_small_batch_matmul().offered,
                                 reason="the small-batch matmul is offered on AVX-512 and AVX2 + FMA builds only")


@SMALL_BATCH
@pytest.mark.parametrize("rows", range(1, SMALL_BATCH_ROWS + 1))
@pytest.mark.parametrize(("out_features", "in_features"), [(3072, 576), (49, 37), (1, 16), (5, 1)])
def test_small_batch_linear_matches_the_float64_product(small_batch_linear, rows, out_features, in_features):
    torch.manual_seed(rows * out_features + in_features)
    weight = torch.randn(out_features, in_features)
    x = torch.randn(rows, in_features)
    got = small_batch_linear(x, weight)
    want = x.double() @ weight.double().T
    assert got.shape == (rows, out_features) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * in_features ** 0.5)


@SMALL_BATCH
def test_small_batch_linear_reads_strided_rows_and_weights(small_batch_linear):
    torch.manual_seed(0)
    x = torch.randn(2, 100)[:, 3:67]  # rows 100 floats apart
    weight = torch.randn(40, 80)[::2, :64]  # every other weight row
    torch.testing.assert_close(small_batch_linear(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5)


@SMALL_BATCH
def test_the_avx2_small_batch_build_matches_the_float64_product(build_for_march):
    """The AVX2 + FMA build (16 depths a step as two 8-lane halves, a ragged tail), whatever this host builds."""
    function = load_small_batch_matmul()
    library = build_for_march(SOURCE, "haswell", SimpleNamespace(small_batch_matmul_f32=function))
    torch.manual_seed(4)
    for rows in range(1, SMALL_BATCH_ROWS + 1):
        for out_features, in_features in ((960, 576), (49, 37), (1, 16), (5, 1)):
            x = torch.randn(rows, in_features + 3)[:, :in_features]  # strided rows
            weight = torch.randn(out_features, in_features)
            out = torch.full((rows, out_features + 1), float("nan"))
            library.small_batch_matmul_f32(x.data_ptr(), rows, in_features, x.stride(0), weight.data_ptr(),
                                           out_features, weight.stride(0), out.data_ptr(), out.stride(0))
            torch.testing.assert_close(out[:, :out_features].double(), x.double() @ weight.double().T, rtol=1e-5,
                                       atol=1e-5 * in_features ** 0.5)
            assert out[:, out_features:].isnan().all()  # nothing past the product is written
    assert library.small_batch_matmul_offered() == 1


def test_small_batch_linear_declines_what_onednn_does_better(small_batch_linear):
    weight = torch.randn(8, 16)
    assert small_batch_linear(torch.randn(PANEL_MAX_ROWS + 1, 16), weight) is None
    assert small_batch_linear(torch.randn(1, 16, dtype=torch.bfloat16), weight.bfloat16()) is None
    assert small_batch_linear(torch.randn(16, 2).t(), weight) is None  # columns not contiguous
    assert small_batch_linear(torch.randn(1, 8), weight) is None  # widths differ
    assert small_batch_linear(torch.randn(0, 16), weight) is None


def test_it_covers_float32_weights_only_with_bf16x3():
    weight = torch.randn(24, 16)
    assert not SmallBatchLinear(split_bf16=False).covers(weight)
    split = SmallBatchLinear(split_bf16=True)
    if not split.split_bf16 or not load_small_batch_matmul().offered:
        pytest.skip("bf16x3 needs AMX-BF16")
    assert split.covers(weight)
    assert not split.covers(weight.bfloat16())
    assert not split.covers(torch.randn(16, 24).t())  # columns not contiguous
    for rows in (1, 2, 3, 64, PANEL_MAX_ROWS + 1, 2048):  # then every row count is its own
        assert split(torch.randn(rows, 16), weight) is not None
