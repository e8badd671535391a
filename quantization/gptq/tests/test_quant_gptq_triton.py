"""The gptq-triton kernel against the torch reference kernel: 4-bit with and without act order,
symmetric and asymmetric, v1 and v2 zeros, 2 and 8 bits, fused shards with a bias, three compute
dtypes; on the CPU through Triton's interpreter (small shapes), on a GPU with larger ones."""

from __future__ import annotations

import pytest
import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_gptq.gptq_config import GPTQConfig
from tokenmill_quant_gptq.quantize import quantize_gptq
from tokenmill_quant_gptq.quantizer import GPTQQuantizer
from tokenmill_quant_gptq.torch_kernel import GPTQTorchKernel
from tokenmill_quant_gptq.triton_kernel import GPTQTritonKernel
from tokenmill_testkit import kernel_comparison as comparison

TRITON_CAPS = PlatformCapabilities(families=("triton",))


def _layers(config: GPTQConfig, in_features: int, sizes: tuple[int, ...], dtype: torch.dtype, bias: bool = False,
            device: str = comparison.TRITON_DEVICE) -> list[Linear]:
    """The same GPTQ checkpoint loaded into a Triton layer and a torch-reference layer."""
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", in_features, sum(sizes), sizes, bias,
                      str(dtype).removeprefix("torch."))
    perm = torch.randperm(in_features) if config.desc_act else None
    shards = [quantize_gptq(torch.randn(size, in_features) * 0.1, config.bits, config.group_size, config.sym, perm,
                            config.zero_offset).state_dict("x") for size in sizes]
    bias_values = torch.randn(sum(sizes)).to(dtype) if bias else None
    kernels = (GPTQTritonKernel(), GPTQTorchKernel())
    return comparison.loaded_layers(Linear, spec, GPTQQuantizer(config), kernels, shards, bias_values, device)


@pytest.fixture(autouse=True)
def _triton_device():
    comparison.require_triton_device()


@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("desc_act", [False, True])
def test_4bit_matches_the_torch_reference(rows, sym, desc_act):
    config = GPTQConfig(bits=4, group_size=32, sym=sym, desc_act=desc_act)
    comparison.assert_layers_agree(*_layers(config, 128, (96,), torch.float32), rows, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_activations(dtype):
    config = GPTQConfig(bits=4, group_size=64, desc_act=True)
    comparison.assert_layers_agree(*_layers(config, 128, (64,), dtype), 5, dtype)


@pytest.mark.parametrize("bits, group_size", [(8, 32), (2, -1)])
def test_other_bit_widths(bits, group_size):
    comparison.assert_layers_agree(*_layers(GPTQConfig(bits=bits, group_size=group_size), 128, (64,), torch.float32),
                              5, torch.float32)


def test_v2_zeros_fused_shards_and_bias():
    """Ragged output tiles (96 + 32 + 40 columns), zeros stored as they are, and a bias."""
    config = GPTQConfig(bits=4, group_size=64, sym=False, zero_offset=0)
    comparison.assert_layers_agree(*_layers(config, 128, (96, 32, 40), torch.float32, bias=True), 33, torch.float32)


def test_leading_dimensions_and_empty_input():
    triton_layer, reference = _layers(GPTQConfig(bits=4, group_size=32), 64, (32,), torch.float32)
    x = torch.randn(2, 3, 64, device=triton_layer.qweight.device)
    torch.testing.assert_close(triton_layer(x), reference(x), atol=1e-4, rtol=1e-4)
    assert triton_layer(x[:0]).shape == (0, 3, 32)


def test_kernel_order_and_platform_verdicts():
    quantizer = GPTQQuantizer(GPTQConfig(bits=4))
    assert quantizer.kernels() == (GPTQTritonKernel, GPTQTorchKernel)
    spec = LinearSpec("model.layers.0.mlp.down_proj", 256, 128, (128,), False, "float16")
    comparison.assert_triton_family_verdicts(GPTQTritonKernel, quantizer, spec)
    assert GPTQTritonKernel.supports(quantizer, spec, "npu", TRITON_CAPS) is None
    three_bit = GPTQQuantizer(GPTQConfig(bits=3))
    assert "straddle" in GPTQTritonKernel.supports(three_bit, spec, "cuda", TRITON_CAPS)
    assert GPTQTorchKernel.supports(quantizer, spec, "cpu", PlatformCapabilities()) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU guard")
def test_compiled_mode_refuses_cpu_tensors(monkeypatch):
    from tokenmill_quant_gptq import triton_matmul

    triton_layer, _ = _layers(GPTQConfig(bits=4, group_size=32), 64, (32,), torch.float32)
    monkeypatch.setattr(triton_matmul, "INTERPRETED", False)
    with pytest.raises(RuntimeError, match="interpreter"):
        triton_layer(torch.randn(1, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 100, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("desc_act", [False, True])
def test_gpu_large_layers(rows, dtype, desc_act):
    comparison.require_compiled_triton()
    config = GPTQConfig(bits=4, group_size=128, desc_act=desc_act, sym=not desc_act)
    comparison.assert_layers_agree(*_layers(config, 2048, (2048, 512, 512), dtype, bias=True, device="cuda"), rows, dtype)
