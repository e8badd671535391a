"""PanelMatmul (the decode-batch matrix product against packed weight panels) against the float64
product: row counts around its 8-row blocks and up to PANEL_MAX_ROWS, widths around its 48-column
panels, depths past its 192-deep chunks, strided operands, any number of threads sharing the panels;
the packing follows the weight (made again after an in-place change, dropped with the weight); the
layer kernels route rows to it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch

from tokenmill.plugin_api.native import build_failure
from tokenmill_cpu.layer_kernels import layer_ops_unavailable
from tokenmill_cpu.panel_matmul import PANEL_MAX_ROWS, SOURCE, PanelMatmul, load_panel_matmul
from tokenmill_cpu.small_batch_linear import SMALL_BATCH_ROWS, SmallBatchLinear

pytestmark = pytest.mark.skipif(
    build_failure(load_panel_matmul) is not None or not load_panel_matmul().panel_matmul_offered(),
    reason="the panel matmul is offered on AVX-512 and AVX2 + FMA builds only")


@pytest.fixture
def panel() -> PanelMatmul:
    return PanelMatmul()


def _assert_product(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    want = x.double() @ weight.double().T
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * x.shape[1] ** 0.5)


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 64, 67, PANEL_MAX_ROWS])
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (49, 1100), (1, 7), (47, 512), (97, 1)])
def test_matches_the_float64_product(panel, rows, out_features, in_features):
    torch.manual_seed(rows * 131 + out_features * 7 + in_features)
    x, weight = torch.randn(rows, in_features), torch.randn(out_features, in_features)
    assert panel.accepts(x, weight)
    _assert_product(panel(x, weight), x, weight)


def test_the_avx2_build_matches_the_float64_product(build_for_march):
    """The AVX2 + FMA build (blocks of 6 rows x 16 columns, 128-deep chunks), whatever this host builds:
    row counts around its blocks, widths around the panel's thirds, depths past a chunk, strides."""
    panel = PanelMatmul()
    panel._library = build_for_march(SOURCE, "haswell", load_panel_matmul())
    torch.manual_seed(3)
    for rows in (1, 2, 5, 6, 7, 13, 64):
        for out_features, in_features in ((960, 576), (49, 300), (17, 129), (40, 1)):
            x, weight = torch.randn(rows, in_features), torch.randn(out_features, in_features)
            _assert_product(panel(x, weight), x, weight)
    x = torch.randn(7, 700)[:, 3:603]
    weight = torch.randn(100, 640)[::2, :600]
    _assert_product(panel(x, weight), x, weight)


@pytest.mark.parametrize("threads", [1, 3, 70])
def test_every_panel_once_with_any_thread_count(threads):
    """Threads claim panels from their own range, then from the others' (kernels/ranges.h); past its
    64 ranges the extra threads claim nothing. Run in a fresh process to set the OpenMP team size."""
    script = ("import torch\n"
              "from tokenmill_cpu.panel_matmul import PanelMatmul\n"
              "torch.manual_seed(0)\n"
              "for n in (1, 47, 48, 1000, 3100):\n"
              "    x, w = torch.randn(9, 100), torch.randn(n, 100)\n"
              "    torch.testing.assert_close(PanelMatmul()(x, w).double(), x.double() @ w.double().T, rtol=1e-5, "
              "atol=1e-4)\n")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_reads_strided_rows_and_weights(panel):
    torch.manual_seed(0)
    x = torch.randn(12, 700)[:, 3:603]  # rows 700 floats apart
    weight = torch.randn(100, 640)[::2, :600]  # every other weight row
    assert panel.accepts(x, weight)
    _assert_product(panel(x, weight), x, weight)


def test_the_packing_follows_the_weight(panel):
    torch.manual_seed(1)
    x, weight = torch.randn(5, 64), torch.randn(100, 64)
    before = panel(x, weight)
    assert panel(x, weight) is not before and len(panel._packed) == 1  # packed once, reused
    weight.mul_(2)  # in place: same storage, new version
    torch.testing.assert_close(panel(x, weight), 2 * before, rtol=1e-5, atol=1e-5)
    del weight
    gc.collect()
    assert not panel._packed


def test_declines_other_operands(panel):
    weight = torch.randn(8, 16)
    assert not panel.accepts(torch.randn(PANEL_MAX_ROWS + 1, 16), weight)
    assert not panel.accepts(torch.randn(0, 16), weight)
    assert not panel.accepts(torch.randn(4, 16, dtype=torch.bfloat16), weight.bfloat16())
    assert not panel.accepts(torch.randn(16, 4).t(), weight)  # columns not contiguous
    assert not panel.accepts(torch.randn(4, 8), weight)  # widths differ


@pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the layer kernels")
def test_the_small_batch_linear_takes_decode_rows_to_it():
    kernels = SmallBatchLinear()
    torch.manual_seed(2)
    weight = torch.randn(300, 200)
    for rows in (SMALL_BATCH_ROWS + 1, PANEL_MAX_ROWS):
        x = torch.randn(rows, 200)
        _assert_product(kernels(x, weight), x, weight)
    assert len(kernels._panel_matmul._packed) == 1
    assert kernels(torch.randn(PANEL_MAX_ROWS + 1, 200), weight) is None
