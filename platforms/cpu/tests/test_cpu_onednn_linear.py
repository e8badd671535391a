"""The CPU platform's oneDNN linear: offered for plain float weights through ``linear_kernels`` (as it is
for full-precision layers, as ``gguf-dequantized+onednn-linear`` for dequantized GGUF ones) and chosen
where today's preference puts it. It keeps a reordered copy of each weight only where oneDNN may run: a
weight ``SmallBatchLinear`` covers at every row count saves that copy, and should oneDNN still be asked
(rows it declines) the copy is made then; results match ``F.linear`` either way."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tokenmill_cpu.onednn_linear import OneDnnLinearKernel, onednn_unavailable

pytestmark = pytest.mark.skipif(onednn_unavailable() is not None, reason="no oneDNN in this torch build")


class RowLimited:
    """Multiplies up to ``limit`` rows itself; ``covers`` answers what it claims about the weight."""

    def __init__(self, covers: bool, limit: int) -> None:
        self.claims, self.limit, self.calls = covers, limit, 0

    def covers(self, weight):
        return self.claims

    def __call__(self, x, weight):
        if x.shape[0] > self.limit:
            return None
        self.calls += 1
        return x @ weight.T


def _kernel(small_batch):
    return OneDnnLinearKernel.using(lambda: small_batch)()


def _layer(bias=False):
    torch.manual_seed(0)
    return SimpleNamespace(weight=torch.randn(24, 16), bias=torch.randn(24) if bias else None)


def test_a_covered_layer_keeps_no_reordered_copy():
    small = RowLimited(covers=True, limit=1 << 30)
    kernel, layer = _kernel(small), _layer()
    kernel.process_weights_after_loading(layer)
    assert layer.onednn_weight is None
    x = torch.randn(5, 16)
    torch.testing.assert_close(kernel.apply(layer, x, None), F.linear(x, layer.weight))
    assert layer.onednn_weight is None and small.calls == 1


def test_a_covered_layer_still_runs_rows_the_small_batch_products_decline():
    kernel, layer = _kernel(RowLimited(covers=True, limit=2)), _layer()  # one that misjudged
    kernel.process_weights_after_loading(layer)
    x = torch.randn(7, 16)
    torch.testing.assert_close(kernel.apply(layer, x, None), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert layer.onednn_weight is not None  # made at that first oneDNN call, kept for the next


@pytest.mark.parametrize(("covers", "bias"), [(False, False), (True, True)])
def test_other_layers_are_reordered_at_load(covers, bias):
    small = RowLimited(covers=covers, limit=2)
    kernel, layer = _kernel(small), _layer(bias=bias)
    kernel.process_weights_after_loading(layer)
    assert layer.onednn_weight is not None and layer.onednn_source == layer.weight.data_ptr()
    x = torch.randn(7, 16)
    torch.testing.assert_close(kernel.apply(layer, x, layer.bias), F.linear(x, layer.weight, layer.bias),
                               rtol=1e-5, atol=1e-5)
    assert small.calls == 0


def test_a_kernel_without_small_batch_products_is_reordered_at_load_and_runs_onednn():
    kernel, layer = OneDnnLinearKernel(), _layer()
    kernel.process_weights_after_loading(layer)
    assert layer.onednn_weight is not None
    x = torch.randn(1, 16)
    torch.testing.assert_close(kernel.apply(layer, x, None), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
