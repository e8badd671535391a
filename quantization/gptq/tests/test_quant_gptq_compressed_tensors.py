"""compressed-tensors pack-quantized layers against the compressed-tensors library's own compressor:
tensors it compresses load into core's Linear and multiply exactly like the weights it decompresses."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams

from tokenmill.plugin_api import LinearSpec
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_gptq.compressed_tensors_config import PackQuantizedScheme
from tokenmill_quant_gptq.compressed_tensors_kernel import CompressedTensorsPackTorchKernel
from tokenmill_quant_gptq.compressed_tensors_quantizer import CompressedTensorsPackQuantizer

IN = 256
SIZES = (64, 32, 32)


def ct_config(bits: int, group_size: int | None, symmetric: bool, actorder: str | None = None) -> dict:
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric,
               "strategy": "channel" if group_size is None else "group", "group_size": group_size, "actorder": actorder}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}}}


def ct_compress(weight: torch.Tensor, config: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """compressed-tensors' own quantize + pack of ``weight`` and its own decompression."""
    scheme = QuantizationScheme.model_validate(config["config_groups"]["group_0"])
    args: QuantizationArgs = scheme.weights
    groups = weight.reshape(weight.shape[0], -1, args.group_size or weight.shape[1])
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    state = {"weight": weight, "weight_scale": scale.float(), "weight_zero_point": zero_point}
    compressed = PackedQuantizationCompressor.compress(state, scheme)
    decompressed = PackedQuantizationCompressor.decompress(dict(compressed), scheme)["weight"]
    return dict(compressed), decompressed.float()


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [None, 32])
@pytest.mark.parametrize("symmetric", [True, False])
def test_fused_layer_equals_compressed_tensors_decompression(bits, group_size, symmetric):
    config = ct_config(bits, group_size, symmetric)
    quantizer = CompressedTensorsPackQuantizer.from_config({"quantization_config": config}, "")
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", IN, sum(SIZES), SIZES, False, "float32")
    layer = Linear(spec, quantizer, CompressedTensorsPackTorchKernel())
    reference = []
    for index, size in enumerate(SIZES):
        tensors, decompressed = ct_compress(torch.randn(size, IN) * 0.1, config)
        assert ("weight_zero_point" in tensors) == (not symmetric)
        for name, tensor in tensors.items():
            layer.load_weight(name, tensor, index)
        reference.append(decompressed)
    x = torch.randn(3, 4, IN)
    torch.testing.assert_close(layer(x), F.linear(x, torch.cat(reference)), atol=1e-5, rtol=1e-5)


def test_legacy_group_actorder_uses_g_idx():
    """compressed-tensors < 0.20 wrote ``actorder: group`` checkpoints with a ``weight_g_idx``."""
    config = ct_config(4, 64, True, actorder="group")
    quantizer = CompressedTensorsPackQuantizer.from_config({"quantization_config": config}, "")
    spec = LinearSpec("model.layers.0.mlp.down_proj", IN, 64, (64,), False, "float32")
    layer = Linear(spec, quantizer, CompressedTensorsPackTorchKernel())
    tensors, _ = ct_compress(torch.randn(64, IN) * 0.1, ct_config(4, 64, True))
    g_idx = torch.randperm(IN) // 64
    for name, tensor in {**tensors, "weight_g_idx": g_idx.to(torch.int32)}.items():
        layer.load_weight(name, tensor)
    q = unpack_from_int32(tensors["weight_packed"], 4, torch.Size([64, IN])).float()
    expected = q * tensors["weight_scale"][:, g_idx]
    x = torch.randn(5, IN)
    torch.testing.assert_close(layer(x), F.linear(x, expected), atol=1e-5, rtol=1e-5)


def test_weight_shape_is_checked():
    quantizer = CompressedTensorsPackQuantizer.from_config({"quantization_config": ct_config(4, 32, True)}, "")
    layer = Linear(LinearSpec("m.qkv_proj", IN, 128, SIZES, False, "float32"), quantizer,
                   CompressedTensorsPackTorchKernel())
    with pytest.raises(ValueError, match=r"shard 1 was quantized with shape \(64, 256\).*expects \(32, 256\)"):
        layer.load_weight("weight_shape", torch.tensor([64, IN]), 1)


def test_detection_and_parsing():
    hf = {"quantization_config": ct_config(4, 128, False)}
    assert CompressedTensorsPackQuantizer.detect(hf, "") == 1.0
    per_group_format = json.loads(json.dumps(hf))
    per_group_format["quantization_config"]["format"] = "mixed-precision"
    per_group_format["quantization_config"]["config_groups"]["group_0"]["format"] = "pack-quantized"
    assert CompressedTensorsPackQuantizer.detect(per_group_format, "") == 1.0
    fp8 = json.loads(json.dumps(hf))
    fp8["quantization_config"]["format"] = "float-quantized"
    assert CompressedTensorsPackQuantizer.detect(fp8, "") == 0.0
    assert CompressedTensorsPackQuantizer.detect({"quantization_config": {"quant_method": "gptq"}}, "") == 0.0
    quantizer = CompressedTensorsPackQuantizer.from_config(hf, "")
    assert quantizer.scheme == PackQuantizedScheme(bits=4, group_size=128, symmetric=False, group_actorder=False,
                                                   ignore=("lm_head",))
    assert quantizer.describe() == "compressed-tensors pack-quantized int4 g128 asym"


@pytest.mark.parametrize("change, message", [
    (lambda c: c["config_groups"].update(group_1=c["config_groups"]["group_0"]), "2 config groups"),
    (lambda c: c["config_groups"]["group_0"].update(input_activations={"num_bits": 8}), "quantized activations"),
    (lambda c: c["config_groups"]["group_0"]["weights"].update(strategy="tensor"), "strategy 'tensor'"),
    (lambda c: c["config_groups"]["group_0"]["weights"].update(num_bits=16), "num_bits=16"),
    (lambda c: c["config_groups"]["group_0"]["weights"].update(type="float"), "type 'float'"),
])
def test_unsupported_schemes(change, message):
    config = ct_config(4, 128, True)
    change(config)
    with pytest.raises(ValueError, match=message):
        CompressedTensorsPackQuantizer.from_config({"quantization_config": config}, "")


def test_ignore_and_targets():
    config = ct_config(4, 128, True)
    config["ignore"] = ["lm_head", "re:.*mlp.down_proj$"]
    quantizer = CompressedTensorsPackQuantizer.from_config({"quantization_config": config}, "")
    spec = lambda prefix, sizes=(64,): LinearSpec(prefix, IN, sum(sizes), sizes, False, "float32")  # noqa: E731
    assert not quantizer.is_quantized(spec("lm_head"))
    assert not quantizer.is_quantized(spec("model.layers.3.mlp.down_proj"))
    assert quantizer.is_quantized(spec("model.layers.3.self_attn.qkv_proj", SIZES))
    config["ignore"] = ["model.layers.0.self_attn.k_proj"]
    partial = CompressedTensorsPackQuantizer.from_config({"quantization_config": config}, "")
    with pytest.raises(ValueError, match="quantizes only some of the shards"):
        partial.is_quantized(spec("model.layers.0.self_attn.qkv_proj", SIZES))


def test_tiny_llama_matches_transformers(checkpoints):
    config = ct_config(4, 32, False)

    def quantize(name, weight):
        tensors, decompressed = ct_compress(weight, config)
        return {f"{name}.{key}": value for key, value in tensors.items()}, decompressed

    tokens = [5, 9, 31, 77, 2, 64, 120, 3]
    kernels = checkpoints.kernels_matching_transformers(quantize, config, CompressedTensorsPackQuantizer, tokens)
    assert kernels == {"compressed-tensors-pack-torch": 8, "torch-linear": 1}
