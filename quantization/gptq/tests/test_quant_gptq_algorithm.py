"""GPTQ's integer grid on core's error-feedback solver: the packed tensors decode to the weights it
reports, it rounds like ``quantize_gptq`` when inputs are uncorrelated, it lowers the output error
on correlated inputs, and act order records its groups in ``g_idx``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenmill.plugin_api.quantize_tools import HessianAccumulator, column_order
from tokenmill_quant_gptq.dequantize import dequantize_columns
from tokenmill_quant_gptq.gptq_algorithm import gptq_quantize, group_parameters
from tokenmill_quant_gptq.quantize import quantize_gptq

IN, OUT = 192, 64


def _inputs(rows: int = 3000, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    mix = torch.randn(IN, IN, generator=generator) / IN**0.5 + torch.eye(IN)
    return torch.randn(rows, IN, generator=generator) @ mix * (torch.rand(IN, generator=generator) * 3)


def _hessian(x: torch.Tensor) -> torch.Tensor:
    accumulator = HessianAccumulator(x.shape[1])
    accumulator.add(x)
    return accumulator.matrix


def _decode(tensors, bits: int, zero_offset: int = 1) -> torch.Tensor:
    layer = SimpleNamespace(qweight=tensors.qweight, qzeros=tensors.qzeros, scales=tensors.scales, g_idx=tensors.g_idx)
    return dequantize_columns(layer, bits, zero_offset, 0, OUT, torch.float32).T


@pytest.mark.parametrize("bits, group_size, sym, act_order", [(4, 64, True, False), (4, 32, False, True),
                                                              (8, -1, True, True), (2, 64, False, False),
                                                              (3, 64, True, True)])
def test_packed_tensors_decode_to_the_reported_weights(bits, group_size, sym, act_order):
    weight = torch.randn(OUT, IN) * 0.05
    tensors = gptq_quantize(weight, _hessian(_inputs()), bits, group_size, sym, act_order)
    torch.testing.assert_close(_decode(tensors, bits), tensors.dequantized, atol=1e-6, rtol=0)
    assert tensors.scales.dtype == torch.float16 and tensors.g_idx.dtype == torch.int32


@pytest.mark.parametrize("sym", [True, False])
def test_uncorrelated_inputs_round_like_quantize_gptq(sym):
    weight = torch.randn(OUT, IN) * 0.05
    tensors = gptq_quantize(weight, torch.eye(IN), 4, 64, sym)
    reference = quantize_gptq(weight, 4, 64, sym)
    for name in ("qweight", "qzeros", "scales", "g_idx"):
        assert torch.equal(getattr(tensors, name), getattr(reference, name)), name


@pytest.mark.parametrize("act_order", [False, True])
def test_error_feedback_beats_round_to_nearest(act_order):
    weight = torch.randn(OUT, IN) * 0.05
    x, held_out = _inputs(seed=0), _inputs(seed=0)[:500] + 0.01 * _inputs(500, seed=1)
    tensors = gptq_quantize(weight, _hessian(x), 4, 64, sym=False, act_order=act_order)
    rtn = quantize_gptq(weight, 4, 64, sym=False).dequantized

    def error(w):
        return ((held_out @ (w - weight).T) ** 2).mean()

    assert error(tensors.dequantized) < 0.7 * error(rtn)


def test_act_order_groups_follow_the_hessian_diagonal():
    hessian = _hessian(_inputs())
    tensors = gptq_quantize(torch.randn(OUT, IN) * 0.05, hessian, 4, 64, act_order=True, zero_offset=0)
    order = column_order(hessian, act_order=True)
    assert torch.equal(tensors.g_idx[order].long(), torch.arange(IN) // 64)
    assert not torch.equal(tensors.g_idx.long(), torch.arange(IN) // 64)
    torch.testing.assert_close(_decode(tensors, 4, zero_offset=0), tensors.dequantized, atol=1e-6, rtol=0)


def test_group_parameters():
    columns = torch.tensor([[-1.0, 0.5, 2.0], [0.25, 0.5, 1.5], [0.0, 0.0, 0.0]])
    scale, zero = group_parameters(columns, 4, sym=False)
    torch.testing.assert_close(scale, torch.tensor([0.2, 0.1, 2 / 15]).to(torch.float16).float())
    assert zero.tolist() == [5, 0, 8]  # the range always includes 0; an all-zero group spans [-1, 1]
    scale, zero = group_parameters(columns, 4, sym=True)
    torch.testing.assert_close(scale, torch.tensor([4 / 15, 0.1, 2 / 15]).to(torch.float16).float())
    assert zero.tolist() == [8, 8, 8]
