"""core's oneDNN linear keeps a reordered copy of each weight only where it may run: a platform whose
``small_batch_linear`` covers every row count of a layer (``small_batch_linear_covers``) saves that copy,
and should oneDNN still be asked (rows the platform declines) the copy is made then; results match
``F.linear`` either way."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tokenmill.layers.onednn_linear import OneDnnLinearKernel, onednn_unavailable
from tokenmill.plugin_api import LayerKernels

pytestmark = pytest.mark.skipif(onednn_unavailable() is not None, reason="no oneDNN in this torch build")


class RowLimited(LayerKernels):
    """Multiplies up to ``limit`` rows itself; ``covers`` is what it claims about the weight."""

    def __init__(self, covers: bool, limit: int) -> None:
        self.covers, self.limit, self.calls = covers, limit, 0

    def small_batch_linear_covers(self, weight):
        return self.covers

    def small_batch_linear(self, x, weight):
        if x.shape[0] > self.limit:
            return None
        self.calls += 1
        return x @ weight.T


def _layer(kernels, bias=False):
    torch.manual_seed(0)
    return SimpleNamespace(weight=torch.randn(24, 16), bias=torch.randn(24) if bias else None, kernels=kernels)


def test_a_covered_layer_keeps_no_reordered_copy():
    kernel, layer = OneDnnLinearKernel(), _layer(RowLimited(covers=True, limit=1 << 30))
    kernel.process_weights_after_loading(layer)
    assert layer.onednn_weight is None
    x = torch.randn(5, 16)
    torch.testing.assert_close(kernel.apply(layer, x, None), F.linear(x, layer.weight))
    assert layer.onednn_weight is None and layer.kernels.calls == 1


def test_a_covered_layer_still_runs_rows_the_platform_declines():
    kernel, layer = OneDnnLinearKernel(), _layer(RowLimited(covers=True, limit=2))  # a platform that misjudged
    kernel.process_weights_after_loading(layer)
    x = torch.randn(7, 16)
    torch.testing.assert_close(kernel.apply(layer, x, None), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert layer.onednn_weight is not None  # made at that first oneDNN call, kept for the next


@pytest.mark.parametrize(("covers", "bias"), [(False, False), (True, True)])
def test_other_layers_are_reordered_at_load(covers, bias):
    kernel, layer = OneDnnLinearKernel(), _layer(RowLimited(covers=covers, limit=2), bias=bias)
    kernel.process_weights_after_loading(layer)
    assert layer.onednn_weight is not None and layer.onednn_source == layer.weight.data_ptr()
    x = torch.randn(7, 16)
    torch.testing.assert_close(kernel.apply(layer, x, layer.bias), F.linear(x, layer.weight, layer.bias),
                               rtol=1e-5, atol=1e-5)


def test_a_layer_without_platform_kernels_is_reordered_at_load():
    kernel, layer = OneDnnLinearKernel(), SimpleNamespace(weight=torch.randn(24, 16), bias=None)
    kernel.process_weights_after_loading(layer)
    assert layer.onednn_weight is not None
