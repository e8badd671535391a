"""AWQ: packing against AutoAWQ's packer, layers through core's Linear (fused shards, tiling, bf16),
configuration, and a tiny model end to end against transformers."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_awq.awq_config import AWQConfig
from tokenmill_quant_awq.packing import pack_int4, unpack_int4
from tokenmill_quant_awq.quantize import quantize_awq
from tokenmill_quant_awq.quantizer import AWQQuantizer
from tokenmill_quant_awq.torch_kernel import AWQTorchKernel
from tokenmill_testkit import QuantizerConformance
from tokenmill_testkit.kernel_comparison import loaded_layers

IN = 256
QKV = (128, 64, 64)


def autoawq_pack(intweight: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's ``WQLinear_GEMM.from_linear`` packing loop for ``intweight`` [in, out]."""
    pack_num, order_map = 8, [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = torch.zeros((intweight.shape[0], intweight.shape[1] // pack_num), dtype=torch.int32)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            qweight[:, col] |= intweight[:, col * pack_num + order_map[i]].to(torch.int32) << (i * 4)
    return qweight


def test_packing_matches_autoawq():
    values = torch.randint(0, 16, (16, 64), dtype=torch.int32)
    expected = autoawq_pack(values)
    assert torch.equal(pack_int4(values), expected)
    assert torch.equal(unpack_int4(expected), values)


def test_packing_errors():
    with pytest.raises(ValueError, match="groups of 8"):
        pack_int4(torch.zeros(2, 12, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack_int4(torch.full((1, 8), 16))
    with pytest.raises(TypeError, match="int32"):
        unpack_int4(torch.zeros(1, 1, dtype=torch.int64))


def _layer(group_size=64, sizes=QKV, dtype="float32", bias=False):
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", IN, sum(sizes), sizes, bias, dtype)
    shards = [quantize_awq(torch.randn(size, IN) * 0.1, group_size) for size in sizes]
    (layer,) = loaded_layers(Linear, spec, AWQQuantizer(AWQConfig(group_size=group_size)), (AWQTorchKernel(),),
                             [tensors.state_dict("x") for tensors in shards], torch.randn(sum(sizes)) if bias else None,
                             "cpu")
    return layer, torch.cat([tensors.dequantized for tensors in shards])


@pytest.mark.parametrize("group_size", [32, 128, 256])
def test_fused_layer_equals_float_matmul(group_size):
    layer, weight = _layer(group_size, bias=True)
    x = torch.randn(2, 3, IN)
    torch.testing.assert_close(layer(x), F.linear(x, weight, layer.bias), atol=1e-4, rtol=1e-4)


def test_quantized_weights_are_close_to_the_originals():
    weight = torch.randn(64, IN) * 0.1
    assert (quantize_awq(weight, 32).dequantized - weight).abs().max() < 0.05


def test_tiles_and_bfloat16(monkeypatch):
    layer, weight = _layer(dtype="bfloat16")
    monkeypatch.setattr(AWQTorchKernel, "tile_elements", IN * 24)  # 24-column tiles
    x = torch.randn(4, IN, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight), atol=0.05, rtol=0.02)


def test_packed_storage_is_a_fraction_of_float32():
    layer, _ = _layer(group_size=128)
    assert sum(p.numel() * p.element_size() for p in layer.parameters()) <= 0.2 * 4 * IN * sum(QKV)


def test_shapes_that_do_not_fit_are_refused():
    quantizer = AWQQuantizer(AWQConfig(group_size=128))
    with pytest.raises(ValueError, match="not a multiple of group size 128"):
        Linear(LinearSpec("m.down_proj", 192, 64, (64,), False, "float32"), quantizer, AWQTorchKernel())
    with pytest.raises(ValueError, match="divisible by 8"):
        Linear(LinearSpec("m.qkv_proj", IN, 76, (64, 12), False, "float32"), quantizer, AWQTorchKernel())


def test_config_parsing_and_detection(tmp_path):
    hf = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm",
                                  "zero_point": True, "modules_to_not_convert": ["visual"]}}
    assert AWQQuantizer.detect(hf, str(tmp_path)) == 1.0
    assert AWQQuantizer.detect({"quantization_config": {"quant_method": "gptq"}}, str(tmp_path)) == 0.0
    quantizer = AWQQuantizer.from_config(hf, str(tmp_path))
    assert quantizer.config == AWQConfig(group_size=64, modules_to_not_convert=("visual",))
    assert quantizer.describe() == "awq 4-bit g64 (gemm)"
    assert not quantizer.is_quantized(LinearSpec("lm_head", 64, 128, (128,), False, "float32"))
    (tmp_path / "quant_config.json").write_text(json.dumps({"w_bit": 4, "q_group_size": 32, "version": "GEMM"}))
    assert AWQQuantizer.detect({}, str(tmp_path)) == 1.0
    assert AWQQuantizer.from_config({}, str(tmp_path)).config.group_size == 32


@pytest.mark.parametrize("field, value, message", [
    ("bits", 3, "bits=3 is not supported"),
    ("version", "gemv", "version 'gemv' is not supported"),
    ("zero_point", False, "without zero points"),
    ("group_size", -1, "group_size=-1 must be a positive integer"),
])
def test_bad_configs(field, value, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        AWQQuantizer.from_config({"quantization_config": {"quant_method": "awq", field: value}}, str(tmp_path))


def test_tiny_llama_matches_transformers(checkpoints):
    qc = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}

    def quantize(name, weight):
        tensors = quantize_awq(weight, 32)
        return tensors.state_dict(name), tensors.dequantized

    kernels = checkpoints.kernels_matching_transformers(quantize, qc, AWQQuantizer, [7, 1, 90, 45, 33, 8, 12])
    assert kernels == {"awq-torch": 8, "torch-linear": 1}


class TestAWQConformance(QuantizerConformance):
    quantizer_cls = AWQQuantizer
    hf_config = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}}
    capabilities = PlatformCapabilities(families=("triton",))  # the Triton kernel runs where --tokenmill-device allows
