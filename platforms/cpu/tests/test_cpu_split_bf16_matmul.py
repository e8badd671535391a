"""SplitBf16Matmul (float32 products as three bfloat16 products on AMX) against the same three
products summed in float64, and against the exact product within the split's error bound: row
counts around its 16- and 32-row tiles and its row blocks, widths and depths around its 32-wide tile
pairs and slices, strided operands, any thread count; the packing follows the weight; the layer
kernels route rows to it only when asked; the environment variable that turns it off."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from tokenmill.plugin_api.native import build_failure
from tokenmill_cpu.layer_kernels import layer_ops_unavailable
from tokenmill_cpu.platform import CpuPlatform
from tokenmill_cpu.small_batch_linear import SMALL_BATCH_ROWS, SmallBatchLinear
from tokenmill_cpu.split_bf16_matmul import (
    PRECISION_ENV,
    SplitBf16Matmul,
    fp32_matmul_precision,
    load_split_bf16_matmul,
)

offered = build_failure(load_split_bf16_matmul) is None and bool(load_split_bf16_matmul().split_bf16_matmul_offered())
needs_amx = pytest.mark.skipif(not offered, reason="the split-bfloat16 matmul needs AMX-BF16 (and a C compiler)")


def _parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hi = t.bfloat16().double()
    return hi, (t.double() - hi).float().bfloat16().double()


def _three_products(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    (xh, xl), (wh, wl) = _parts(x), _parts(weight)
    return xh @ wh.T + xh @ wl.T + xl @ wh.T


def _assert_split_product(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    assert got.shape == (x.shape[0], weight.shape[0]) and got.dtype == torch.float32
    scale = x.double().abs() @ weight.double().abs().T
    # float32 sums of 3K exact products: within 3K * 2^-24 of the magnitudes summed
    float32_sums = scale * (3 * x.shape[1] * 2.0 ** -24) + 1e-30
    assert ((got.double() - _three_products(x, weight)).abs() <= float32_sums).all()
    # the dropped terms (lo * lo, and each part's residue) stay under 4 * 2^-16 of each product
    exact = x.double() @ weight.double().T
    assert ((got.double() - exact).abs() <= scale * 2.0 ** -14 + float32_sums).all()


@needs_amx
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 32, 33, 64, 100, 300])
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (49, 1100), (1, 7), (33, 1536), (97, 1)])
def test_matches_three_bfloat16_products(rows, out_features, in_features):
    torch.manual_seed(rows * 131 + out_features * 7 + in_features)
    x, weight = torch.randn(rows, in_features), torch.randn(out_features, in_features)
    matmul = SplitBf16Matmul()
    assert matmul.accepts(x, weight)
    _assert_split_product(matmul(x, weight), x, weight)


@needs_amx
def test_many_row_blocks_and_wide_range_values():
    """Past one row block (512 KiB of split rows), with values over many binades (the lo part of a
    large value is far above a small value's hi part)."""
    torch.manual_seed(3)
    x = torch.randn(1500, 600) * torch.logspace(-6, 6, 600)
    weight = torch.randn(130, 600) * torch.logspace(3, -3, 600)
    _assert_split_product(SplitBf16Matmul()(x, weight), x, weight)


@needs_amx
def test_strided_rows_and_weight():
    torch.manual_seed(1)
    x = torch.randn(40, 300)[:, :200]
    weight = torch.randn(70, 256)[:, 10:210]
    _assert_split_product(SplitBf16Matmul()(x, weight), x, weight)


@needs_amx
def test_packing_follows_in_place_weight_changes():
    torch.manual_seed(2)
    matmul, x, weight = SplitBf16Matmul(), torch.randn(8, 64), torch.randn(40, 64)
    _assert_split_product(matmul(x, weight), x, weight)
    weight.mul_(-2.0)
    _assert_split_product(matmul(x, weight), x, weight)


@needs_amx
def test_declines_other_operands():
    matmul, weight = SplitBf16Matmul(), torch.randn(8, 16)
    assert not matmul.accepts(torch.randn(4, 16, dtype=torch.bfloat16), weight.bfloat16())
    assert not matmul.accepts(torch.randn(16, 4).t(), weight)  # columns not contiguous
    assert not matmul.accepts(torch.randn(4, 8), weight)  # widths differ
    assert not matmul.accepts(torch.randn(0, 16), weight)


@needs_amx
@pytest.mark.parametrize("threads", [1, 3])
def test_any_thread_count(threads):
    """Each thread configures its own tiles; a team of any size covers every column pair once."""
    script = ("import torch\n"
              "from tokenmill_cpu.split_bf16_matmul import SplitBf16Matmul\n"
              "torch.manual_seed(0)\n"
              "for rows, n in ((9, 1), (40, 47), (300, 1000)):\n"
              "    x, w = torch.randn(rows, 100), torch.randn(n, 100)\n"
              "    torch.testing.assert_close(SplitBf16Matmul()(x, w).double(), x.double() @ w.double().T, "
              "rtol=1e-3, atol=1e-3)\n")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@needs_amx
@pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the layer kernels")
def test_the_small_batch_linear_routes_rows_past_the_small_batch_to_it():
    torch.manual_seed(4)
    kernels, weight = SmallBatchLinear(split_bf16=True), torch.randn(96, 128)
    assert kernels.split_bf16
    few = torch.randn(SMALL_BATCH_ROWS, 128)  # float32 arithmetic, straight from the weight
    torch.testing.assert_close(kernels(few, weight).double(), few.double() @ weight.double().T,
                               rtol=1e-5, atol=1e-5)
    for rows in (SMALL_BATCH_ROWS + 1, 64, 1000):  # every larger row count, prefill chunks included
        x = torch.randn(rows, 128)
        _assert_split_product(kernels(x, weight), x, weight)
    assert not SmallBatchLinear().split_bf16


def test_precision_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(PRECISION_ENV, raising=False)
    assert fp32_matmul_precision() == "bf16x3"
    monkeypatch.setenv(PRECISION_ENV, " IEEE ")
    assert fp32_matmul_precision() == "ieee"
    monkeypatch.setenv(PRECISION_ENV, "tf32")
    with pytest.raises(ValueError, match="expected one of bf16x3, ieee"):
        fp32_matmul_precision()


@needs_amx
@pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the layer kernels")
def test_platform_says_when_it_uses_it(monkeypatch, caplog):
    monkeypatch.delenv(PRECISION_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="tokenmill_cpu.platform"):
        assert CpuPlatform()._small_batch_linear.split_bf16
    assert f"{PRECISION_ENV}=ieee" in caplog.text
    monkeypatch.setenv(PRECISION_ENV, "ieee")
    assert not CpuPlatform()._small_batch_linear.split_bf16
