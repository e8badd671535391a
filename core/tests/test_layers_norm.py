"""RMSNorm (plain and with the fused residual add) and SiluAndMul against Hugging Face / torch."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from tokenmill.layers.activation import SiluAndMul
from tokenmill.layers.norm import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_matches_hf(dtype):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, generator=gen).to(dtype)
    ours, hf = RMSNorm(48, eps=1e-5, dtype=dtype), LlamaRMSNorm(48, eps=1e-5).to(dtype)
    ours.weight.data.copy_(weight)
    hf.weight.data.copy_(weight)
    x = (torch.randn(5, 48, generator=gen) * 3).to(dtype)
    residual = torch.randn(5, 48, generator=gen).to(dtype)
    assert torch.equal(ours(x), hf(x))
    normed, new_residual = ours(x, residual)
    assert torch.equal(new_residual, residual + x)
    assert torch.equal(normed, hf(residual + x))


def test_silu_and_mul():
    x = torch.randn(4, 2 * 6)
    want = torch.nn.functional.silu(x[:, :6]) * x[:, 6:]
    assert torch.equal(SiluAndMul()(x), want)
