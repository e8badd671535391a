"""FP8 layers through core's Linear: per-tensor, per-channel and block scales, compressed-tensors'
own float-quantized compression, the W8A8 kernels (run on the CPU, whose torch implements
``_scaled_mm``), the e4m3fnuz re-encoding, configuration, and a tiny model end to end."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams

from tokenmill.plugin_api import Fp8Format, LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_fp8.fp8_scheme import FP8Scheme
from tokenmill_quant_fp8.quantize import quantize_fp8
from tokenmill_quant_fp8.quantizer import FP8Quantizer
from tokenmill_quant_fp8.scaled_mm_kernel import FP8ScaledMMFnuzKernel, FP8ScaledMMKernel, quantize_per_token
from tokenmill_quant_fp8.torch_kernel import FP8TorchKernel
from tokenmill_testkit import QuantizerConformance

IN = 256
QKV = (128, 128, 128)
FP8_CAPS = PlatformCapabilities(fp8_compute=True, fp8_format=Fp8Format.OCP)
FNUZ_CAPS = PlatformCapabilities(fp8_compute=True, fp8_format=Fp8Format.FNUZ)


def _layer(scheme: FP8Scheme, granularity: str, kernel_cls=FP8TorchKernel, dtype="float32", sizes=QKV):
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", IN, sum(sizes), sizes, True, dtype)
    layer = Linear(spec, FP8Quantizer(scheme), kernel_cls())
    dequantized = []
    for index, size in enumerate(sizes):
        tensors = quantize_fp8(torch.randn(size, IN) * 0.1, granularity)
        for name, tensor in tensors.state_dict("x", scheme.scale_name).items():
            layer.load_weight(name.removeprefix("x."), tensor, index)
        layer.load_weight("input_scale", torch.tensor(0.01), index)
        dequantized.append(tensors.dequantized)
    layer.bias.copy_(torch.randn(sum(sizes)))
    layer.process_weights_after_loading()
    return layer, torch.cat(dequantized)


@pytest.mark.parametrize("scheme, granularity", [
    (FP8Scheme(), "tensor"),
    (FP8Scheme(), "channel"),
    (FP8Scheme(block=(128, 128), scale_name="weight_scale_inv"), "block"),
], ids=["per-tensor", "per-channel", "block"])
def test_weight_only_layer_equals_float_matmul(scheme, granularity):
    layer, weight = _layer(scheme, granularity)
    x = torch.randn(2, 3, IN)
    torch.testing.assert_close(layer(x), F.linear(x, weight, layer.bias), atol=1e-4, rtol=1e-4)


def test_per_tensor_scales_fill_their_shard_rows():
    layer, _ = _layer(FP8Scheme(), "tensor")
    scales = layer.weight_scale[:, 0]
    for start in (0, 128, 256):
        assert torch.all(scales[start : start + 128] == scales[start])
    assert len(set(scales[::128].tolist())) == 3


def test_compressed_tensors_float_quantized_compression():
    for strategy in ("tensor", "channel"):
        group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                                                      "symmetric": True}}
        scheme = QuantizationScheme.model_validate(group)
        weight = torch.randn(64, IN) * 0.1
        reduce = (0, 1) if strategy == "tensor" else (1,)
        scale, _ = calculate_qparams(weight.amin(reduce), weight.amax(reduce), scheme.weights)
        scale = scale.reshape(-1, 1) if strategy == "channel" else scale.reshape(1)
        compressed = dict(FloatQuantizationCompressor.compress({"weight": weight, "weight_scale": scale}, scheme))
        decompressed = FloatQuantizationCompressor.decompress(dict(compressed), scheme)["weight"].float()
        config = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": group}}
        quantizer = FP8Quantizer.from_config({"quantization_config": config}, "")
        layer = Linear(LinearSpec("m.down_proj", IN, 64, (64,), False, "float32"), quantizer, FP8TorchKernel())
        for name, tensor in compressed.items():
            layer.load_weight(name, tensor)
        x = torch.randn(5, IN)
        torch.testing.assert_close(layer(x), F.linear(x, decompressed), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel_cls, caps", [(FP8ScaledMMKernel, FP8_CAPS), (FP8ScaledMMFnuzKernel, FNUZ_CAPS)])
@pytest.mark.parametrize("granularity", ["tensor", "channel"])
def test_w8a8_kernels_match_the_emulated_product(kernel_cls, caps, granularity):
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", IN, sum(QKV), QKV, True, "bfloat16")
    assert kernel_cls.supports(FP8Quantizer(), spec, "cpu", caps) is None
    layer, weight = _layer(FP8Scheme(), granularity, kernel_cls, dtype="bfloat16")
    x = torch.randn(7, IN, dtype=torch.bfloat16)
    q, scale = quantize_per_token(x, kernel_cls.fp8_dtype)
    emulated = (q.float() * scale) @ weight.T + layer.bias.float()
    out = layer(x)
    assert out.dtype == torch.bfloat16
    peak = emulated.abs().max()
    assert (out.float() - emulated).abs().max() <= 2**-7 * peak  # bf16 rounding of the product and the bias
    exact = F.linear(x.float(), weight, layer.bias.float())
    assert (out.float() - exact).abs().max() <= 0.05 * peak  # fp8 rounding of the activations


def test_fnuz_reencoding_keeps_values():
    layer, _ = _layer(FP8Scheme(), "channel")
    weight = layer.weight.detach().clone()
    weight.view(torch.int8)[0, 0] = -128  # e4m3fn negative zero, NaN in e4m3fnuz
    scale = layer.weight_scale.detach().clone()
    layer.weight.data.copy_(weight)
    FP8ScaledMMFnuzKernel().process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.float8_e4m3fnuz
    assert torch.equal(layer.weight.float() * layer.weight_scale, weight.float() * scale)
    assert not torch.isnan(layer.weight.float()).any()


@pytest.mark.parametrize("caps, spec_args, scheme, reason", [
    (PlatformCapabilities(), (IN, 64), FP8Scheme(), "no native fp8 matmul"),
    (FNUZ_CAPS, (IN, 64), FP8Scheme(), "computes fp8 as e4m3fnuz"),
    (FP8_CAPS, (IN, 64), FP8Scheme(block=(64, 64)), "block-wise weight scales"),
    (FP8_CAPS, (IN, 40), FP8Scheme(), "divisible by 16"),
])
def test_scaled_mm_declines_with_reasons(caps, spec_args, scheme, reason):
    spec = LinearSpec("m.down_proj", spec_args[0], spec_args[1], (spec_args[1],), False, "bfloat16")
    assert reason in FP8ScaledMMKernel.supports(FP8Quantizer(scheme), spec, "cuda", caps)
    assert FP8TorchKernel.supports(FP8Quantizer(scheme), spec, "cuda", caps) is None


def test_scale_shape_errors():
    layer = Linear(LinearSpec("m.qkv_proj", IN, 192, (128, 64), False, "float32"), FP8Quantizer(), FP8TorchKernel())
    with pytest.raises(ValueError, match="neither per-tensor nor per-channel for 64 output rows"):
        layer.load_weight("weight_scale", torch.ones(128, 1), 1)
    with pytest.raises(ValueError, match="not multiples of the 128-row scale blocks"):
        Linear(LinearSpec("m.qkv_proj", IN, 192, (128, 64), False, "float32"),
               FP8Quantizer(FP8Scheme(block=(128, 128))), FP8TorchKernel())


def test_config_parsing_and_detection():
    fp8 = {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                   "weight_block_size": [128, 128], "modules_to_not_convert": ["mlp.gate"]}}
    assert FP8Quantizer.detect(fp8, "") == 1.0
    scheme = FP8Quantizer.from_config(fp8, "").scheme
    assert scheme == FP8Scheme(block=(128, 128), scale_name="weight_scale_inv", ignore=("mlp.gate", "lm_head"))
    assert FP8Quantizer.from_config(fp8, "").describe() == "fp8 e4m3 (block 128x128 scales; fp8)"
    ct = {"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                                  "ignore": ["lm_head", "re:.*mlp.down_proj"],
                                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                      "num_bits": 8, "type": "float", "strategy": "channel"}}}}}
    assert FP8Quantizer.detect(ct, "") == 1.0
    quantizer = FP8Quantizer.from_config(ct, "")
    spec = lambda prefix, sizes=(64,): LinearSpec(prefix, IN, sum(sizes), sizes, False, "float32")  # noqa: E731
    assert not quantizer.is_quantized(spec("lm_head"))
    assert not quantizer.is_quantized(spec("model.layers.0.mlp.down_proj"))
    assert quantizer.is_quantized(spec("model.layers.0.mlp.gate_up_proj", (64, 64)))
    assert FP8Quantizer.detect({"quantization_config": {"quant_method": "gptq"}}, "") == 0.0
    assert FP8Quantizer.detect({}, "") == 0.0


@pytest.mark.parametrize("weights, message", [
    ({"num_bits": 4, "type": "int", "strategy": "channel"}, "must be 8-bit floats"),
    ({"num_bits": 8, "type": "float", "strategy": "group"}, "strategy 'group'"),
    ({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128]}, "two positive integers"),
])
def test_bad_compressed_tensors_configs(weights, message):
    config = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    with pytest.raises(ValueError, match=message):
        FP8Quantizer.from_config({"quantization_config": config}, "")


def test_tiny_llama_matches_transformers(checkpoints):
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic"}

    def quantize(name, weight):
        tensors = quantize_fp8(weight, "tensor")
        return tensors.state_dict(name), tensors.dequantized

    kernels = checkpoints.kernels_matching_transformers(quantize, qc, FP8Quantizer, [11, 4, 87, 19, 2, 66, 5])
    assert kernels == {"fp8-torch": 8, "torch-linear": 1}


class TestFP8WeightOnlyConformance(QuantizerConformance):
    quantizer_cls = FP8Quantizer
    hf_config = {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}


class TestFP8W8A8Conformance(TestFP8WeightOnlyConformance):
    """The W8A8 kernels against the weight-only reference: activation rounding bounds the agreement."""

    capabilities = FP8_CAPS
    tolerances = {"float32": (0.0, 0.1), "bfloat16": (0.0, 0.1)}
