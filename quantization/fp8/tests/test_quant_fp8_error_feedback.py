"""fp8 rounding with GPTQ's error feedback: the e4m3 codes times the round-to-nearest scales are
the weights it reports, uncorrelated inputs give plain rounding, correlated ones a lower output
error, per channel and per block."""

from __future__ import annotations

import pytest
import torch

from tokenmill.plugin_api.quantize_tools import HessianAccumulator
from tokenmill_quant_fp8.fp8_checkpoint import fp8_error_feedback
from tokenmill_quant_fp8.quantize import quantize_fp8

IN, OUT = 256, 96


def _expanded(scale: torch.Tensor, block) -> torch.Tensor:
    if block is None:
        return scale.expand(OUT, IN)
    return scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:OUT, :IN]


@pytest.mark.parametrize("block", [None, (32, 64)])
@pytest.mark.parametrize("act_order", [False, True])
def test_codes_scales_and_lower_output_error(block, act_order):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3000, IN, generator=generator) @ (torch.randn(IN, IN, generator=generator) / 16 + torch.eye(IN))
    weight = torch.randn(OUT, IN, generator=generator) * 0.05
    hessian = HessianAccumulator(IN)
    hessian.add(x)
    tensors = fp8_error_feedback(weight, hessian.matrix, block, act_order)
    rtn = quantize_fp8(weight, "channel") if block is None else quantize_fp8(weight, "block", block)
    assert tensors.weight.dtype == torch.float8_e4m3fn and torch.equal(tensors.scale, rtn.scale)
    assert torch.equal(tensors.weight.float() * _expanded(tensors.scale, block), tensors.dequantized)

    def error(w):
        return ((x @ (w - weight).T) ** 2).mean()

    assert error(tensors.dequantized) < 0.75 * error(rtn.dequantized)


def test_uncorrelated_inputs_give_round_to_nearest():
    weight = torch.randn(OUT, IN) * 0.05
    tensors = fp8_error_feedback(weight, torch.eye(IN))
    assert torch.equal(tensors.weight.view(torch.uint8), quantize_fp8(weight, "channel").weight.view(torch.uint8))
