"""The awq-triton kernel against the torch reference kernel: group sizes, ragged output tiles,
fused shards with a bias, three compute dtypes; on the CPU through Triton's interpreter (small
shapes), on a GPU with larger ones."""

from __future__ import annotations

import pytest
import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_awq.awq_config import AWQConfig
from tokenmill_quant_awq.quantize import quantize_awq
from tokenmill_quant_awq.quantizer import AWQQuantizer
from tokenmill_quant_awq.torch_kernel import AWQTorchKernel
from tokenmill_quant_awq.triton_kernel import AWQTritonKernel
from tokenmill_testkit import kernel_comparison as comparison

TRITON_CAPS = PlatformCapabilities(families=("triton",))


def _layers(group_size: int, in_features: int, sizes: tuple[int, ...], dtype: torch.dtype, bias: bool = False,
            device: str = comparison.TRITON_DEVICE) -> list[Linear]:
    """The same AWQ checkpoint loaded into a Triton layer and a torch-reference layer."""
    spec = LinearSpec("model.layers.0.mlp.gate_up_proj", in_features, sum(sizes), sizes, bias,
                      str(dtype).removeprefix("torch."))
    shards = [quantize_awq(torch.randn(size, in_features) * 0.1, group_size).state_dict("x") for size in sizes]
    bias_values = torch.randn(sum(sizes)).to(dtype) if bias else None
    return comparison.loaded_layers(Linear, spec, AWQQuantizer(AWQConfig(group_size=group_size)),
                                    (AWQTritonKernel(), AWQTorchKernel()), shards, bias_values, device)


@pytest.fixture(autouse=True)
def _triton_device():
    comparison.require_triton_device()


@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("group_size", [32, 128])
def test_matches_the_torch_reference(rows, group_size):
    comparison.assert_layers_agree(*_layers(group_size, 128, (96,), torch.float32), rows, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_activations(dtype):
    comparison.assert_layers_agree(*_layers(64, 128, (64,), dtype), 5, dtype)


def test_fused_shards_with_ragged_tiles_and_bias():
    """Shards of 96 + 40 columns: the second output tile is partly masked."""
    comparison.assert_layers_agree(*_layers(32, 128, (96, 40), torch.float32, bias=True), 33, torch.float32)


def test_leading_dimensions_and_empty_input():
    triton_layer, reference = _layers(32, 64, (32,), torch.float32)
    x = torch.randn(2, 3, 64, device=triton_layer.qweight.device)
    torch.testing.assert_close(triton_layer(x), reference(x), atol=1e-4, rtol=1e-4)
    assert triton_layer(x[:0]).shape == (0, 3, 32)


def test_kernel_order_and_platform_verdicts():
    quantizer = AWQQuantizer()
    assert quantizer.kernels() == (AWQTritonKernel, AWQTorchKernel)
    spec = LinearSpec("model.layers.0.mlp.down_proj", 256, 128, (128,), False, "bfloat16")
    comparison.assert_triton_family_verdicts(AWQTritonKernel, quantizer, spec)
    assert AWQTritonKernel.supports(quantizer, spec, "xpu", TRITON_CAPS) is None
    assert AWQTorchKernel.supports(quantizer, spec, "cpu", PlatformCapabilities()) is None


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 100, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_large_layers(rows, dtype):
    comparison.require_compiled_triton()
    comparison.assert_layers_agree(*_layers(128, 2048, (4096, 4096), dtype, bias=True, device="cuda"), rows, dtype)
