"""INT8 layers through core's Linear: W8A16 against the float matmul, W8A8's exact integer emulation
against ``torch._int_mm`` (bitwise), compressed-tensors' own int-quantized compression,
configuration, and a tiny model end to end."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_int8.int8_scheme import Int8Scheme
from tokenmill_quant_int8.quantize import quantize_int8, quantize_per_token
from tokenmill_quant_int8.quantizer import INT8Quantizer
from tokenmill_quant_int8.w8a8_kernels import EXACT_CHUNK, Int8IntMMKernel, Int8W8A8TorchKernel, exact_int_product
from tokenmill_quant_int8.weight_only_kernel import Int8WeightOnlyTorchKernel
from tokenmill_testkit import QuantizerConformance
from tokenmill_testkit.kernel_comparison import loaded_layers

IN = 256
QKV = (128, 64, 64)
INT8_CAPS = PlatformCapabilities(int8_dot=True)


def _layer(scheme: Int8Scheme, kernel_cls, granularity="channel", dtype="float32"):
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", IN, sum(QKV), QKV, True, dtype)
    shards = [quantize_int8(torch.randn(size, IN) * 0.1, granularity) for size in QKV]
    (layer,) = loaded_layers(Linear, spec, INT8Quantizer(scheme), (kernel_cls(),),
                             [tensors.state_dict("x") for tensors in shards], torch.randn(sum(QKV)), "cpu")
    return layer, torch.cat([tensors.dequantized for tensors in shards])


@pytest.mark.parametrize("granularity", ["channel", "tensor"])
def test_w8a16_layer_equals_float_matmul(granularity):
    layer, weight = _layer(Int8Scheme(w8a8=False), Int8WeightOnlyTorchKernel, granularity)
    x = torch.randn(2, 3, IN)
    torch.testing.assert_close(layer(x), F.linear(x, weight, layer.bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
def test_w8a8_int_mm_is_bitwise_equal_to_the_exact_emulation(rows):
    layer, weight = _layer(Int8Scheme(), Int8W8A8TorchKernel)
    x = torch.randn(rows, IN)
    reference = layer(x)
    layer.kernel = Int8IntMMKernel()
    assert torch.equal(layer(x), reference)
    q_x, scale_x = quantize_per_token(x)
    emulated = (q_x.float() * scale_x) @ weight.T + layer.bias
    torch.testing.assert_close(reference, emulated, atol=1e-4, rtol=1e-4)
    assert (reference - F.linear(x, weight, layer.bias)).abs().max() <= 0.02 * emulated.abs().max()


def test_exact_int_product_over_many_chunks_at_full_magnitude():
    q_x = torch.full((3, 3 * EXACT_CHUNK + 5), 127, dtype=torch.int8)
    q_x[1] = -127
    q_w = torch.randint(-127, 128, (6, q_x.shape[1]), dtype=torch.int8)
    q_w[0] = 127
    expected = q_x.long() @ q_w.long().T
    assert torch.equal(exact_int_product(q_x, q_w), expected)


def test_w8a8_in_bfloat16():
    layer, weight = _layer(Int8Scheme(), Int8W8A8TorchKernel, dtype="bfloat16")
    x = torch.randn(4, IN, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight, layer.bias.float()), atol=0.1, rtol=0.05)


def test_kernel_choice_follows_the_scheme():
    spec = LinearSpec("m.down_proj", IN, 64, (64,), False, "float32")
    w8a8, w8a16 = INT8Quantizer(Int8Scheme()), INT8Quantizer(Int8Scheme(w8a8=False))
    assert w8a8.kernels() == (Int8IntMMKernel, Int8W8A8TorchKernel)
    assert w8a16.kernels() == (Int8WeightOnlyTorchKernel,)
    assert "int8_dot is false" in Int8IntMMKernel.supports(w8a8, spec, "cpu", PlatformCapabilities())
    assert Int8IntMMKernel.supports(w8a8, spec, "cpu", INT8_CAPS) is None
    odd = LinearSpec("m.down_proj", IN, 60, (60,), False, "float32")
    assert "divisible by 8" in Int8IntMMKernel.supports(w8a8, odd, "cpu", INT8_CAPS)
    assert "weight-only" in Int8W8A8TorchKernel.supports(w8a16, spec, "cpu", INT8_CAPS)
    assert "is W8A8" in Int8WeightOnlyTorchKernel.supports(w8a8, spec, "cpu", INT8_CAPS)


def _ct_config(activations: dict | None, strategy: str = "channel") -> dict:
    group = {"targets": ["Linear"], "input_activations": activations,
             "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": strategy}}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": group}}


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_int_quantized_compression(strategy):
    config = _ct_config(None, strategy)
    scheme = QuantizationScheme.model_validate(config["config_groups"]["group_0"])
    weight = torch.randn(64, IN) * 0.1
    reduce = (1,) if strategy == "channel" else (0, 1)
    scale, zero_point = calculate_qparams(weight.amin(reduce), weight.amax(reduce), scheme.weights)
    scale = scale.reshape(-1, 1) if strategy == "channel" else scale.reshape(1)
    state = {"weight": weight, "weight_scale": scale, "weight_zero_point": zero_point.reshape(scale.shape)}
    compressed = dict(IntQuantizationCompressor.compress(state, scheme))
    decompressed = IntQuantizationCompressor.decompress(dict(compressed), scheme)["weight"].float()
    quantizer = INT8Quantizer.from_config({"quantization_config": config}, "")
    assert not quantizer.scheme.w8a8
    layer = Linear(LinearSpec("m.down_proj", IN, 64, (64,), False, "float32"), quantizer, Int8WeightOnlyTorchKernel())
    for name, tensor in compressed.items():
        layer.load_weight(name, tensor)
    x = torch.randn(5, IN)
    torch.testing.assert_close(layer(x), F.linear(x, decompressed), atol=1e-5, rtol=1e-5)


def test_config_parsing_and_detection():
    own = {"quantization_config": {"quant_method": "int8", "activations": "none", "modules_to_not_convert": ["gate"]}}
    assert INT8Quantizer.detect(own, "") == 1.0
    assert INT8Quantizer.from_config(own, "").scheme == Int8Scheme(w8a8=False, ignore=("gate", "lm_head"))
    assert INT8Quantizer.from_config(own, "").describe() == "int8 W8A16 (weight-only; int8)"
    token = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}
    ct = {"quantization_config": _ct_config(token)}
    assert INT8Quantizer.detect(ct, "") == 1.0
    quantizer = INT8Quantizer.from_config(ct, "")
    assert quantizer.scheme.w8a8 and quantizer.scheme.source == "compressed-tensors"
    assert not quantizer.is_quantized(LinearSpec("lm_head", IN, 64, (64,), False, "float32"))
    assert INT8Quantizer.detect({"quantization_config": {"quant_method": "fp8"}}, "") == 0.0


@pytest.mark.parametrize("config, message", [
    ({"quant_method": "int8", "activations": "static"}, "activations='static'"),
    ({**_ct_config(None), "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}}},
     "must be 8-bit integers"),
    ({**_ct_config(None), "config_groups": {"g": {"weights": {"num_bits": 8, "symmetric": False, "strategy": "channel"}}}},
     "zero points are not supported"),
    ({**_ct_config(None), "config_groups": {"g": {"weights": {"num_bits": 8, "strategy": "group"}}}}, "strategy 'group'"),
])
def test_bad_configs(config, message):
    with pytest.raises(ValueError, match=message):
        INT8Quantizer.from_config({"quantization_config": config}, "")


def _fake_quantize_inputs(model) -> None:
    """Make a transformers model round every decoder linear's input per token, as W8A8 does."""

    def hook(module, args):
        x = args[0]
        q, scale = quantize_per_token(x.reshape(-1, x.shape[-1]))
        return ((q.float() * scale).reshape(x.shape).to(x.dtype),)

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            module.register_forward_pre_hook(hook)


@pytest.mark.parametrize("activations", ["none", "dynamic"])
def test_tiny_llama_matches_transformers(checkpoints, activations):
    """W8A16 against the float model; W8A8 against the float model with activations rounded per token."""
    def quantize(name, weight):
        tensors = quantize_int8(weight)
        return tensors.state_dict(name), tensors.dequantized

    kernels = checkpoints.kernels_matching_transformers(
        quantize, {"quant_method": "int8", "activations": activations}, INT8Quantizer, [9, 14, 120, 3, 55, 71, 6, 2],
        prepare_reference=_fake_quantize_inputs if activations == "dynamic" else None)
    kernel = "int8-w8a8-torch" if activations == "dynamic" else "int8-w8a16-torch"
    assert kernels == {kernel: 8, "torch-linear": 1}


class TestInt8W8A16Conformance(QuantizerConformance):
    quantizer_cls = INT8Quantizer
    hf_config = {"quantization_config": {"quant_method": "int8", "activations": "none"}}


class TestInt8W8A8Conformance(TestInt8W8A16Conformance):
    hf_config = {"quantization_config": {"quant_method": "int8", "activations": "dynamic"}}
    capabilities = INT8_CAPS
