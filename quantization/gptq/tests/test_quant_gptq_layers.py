"""GPTQ layers through core's Linear: every bit width, grouping, symmetry, act order and zero
format, fused shards, and the errors of a wrong checkpoint; plus a tiny model end to end."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tokenmill.plugin_api import LinearSpec
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_gptq.gptq_config import GPTQConfig
from tokenmill_quant_gptq.quantize import quantize_gptq
from tokenmill_quant_gptq.quantizer import GPTQQuantizer
from tokenmill_quant_gptq.torch_kernel import GPTQTorchKernel
from tokenmill_testkit.kernel_comparison import loaded_layers

IN = 256
QKV = (128, 64, 64)


def _fused_layer(config: GPTQConfig, sizes=QKV, bias=False, act_order=True, dtype="float32"):
    """A fused Linear loaded shard by shard from quantize_gptq output; returns it and its float weight."""
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", IN, sum(sizes), sizes, bias, dtype)
    perm = torch.randperm(IN) if config.desc_act and act_order else None
    shards = [quantize_gptq(torch.randn(size, IN) * 0.1, config.bits, config.group_size, config.sym, perm,
                            config.zero_offset) for size in sizes]
    (layer,) = loaded_layers(Linear, spec, GPTQQuantizer(config), (GPTQTorchKernel(),),
                             [shard.state_dict("x") for shard in shards], torch.randn(sum(sizes)) if bias else None,
                             "cpu")
    return layer, torch.cat([shard.dequantized for shard in shards])


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
@pytest.mark.parametrize("sym", [True, False])
def test_fused_layer_equals_float_matmul(bits, group_size, sym):
    config = GPTQConfig(bits=bits, group_size=group_size, sym=sym, desc_act=group_size == 32)
    layer, weight = _fused_layer(config, bias=True)
    x = torch.randn(2, 5, IN)
    torch.testing.assert_close(layer(x), F.linear(x, weight, layer.bias), atol=1e-4, rtol=1e-4)


def test_quantized_weights_are_close_to_the_originals():
    weight = torch.randn(64, IN) * 0.1
    for bits, limit in ((8, 0.004), (4, 0.06), (3, 0.12)):
        assert (quantize_gptq(weight, bits, 32).dequantized - weight).abs().max() < limit


def test_act_order_groups_follow_the_permutation():
    perm = torch.randperm(IN)
    tensors = quantize_gptq(torch.randn(32, IN), 4, 64, act_order=perm)
    assert torch.equal(tensors.g_idx[perm].long(), torch.arange(IN) // 64)


def test_v2_zero_format_and_v1_zero_wraparound():
    """v1 stores zero - 1, so an asymmetric zero of 0 is stored as 2**bits - 1 and must read back as 0."""
    weight = torch.rand(64, IN) + 0.5  # all positive: asymmetric zero points are 0
    v1 = quantize_gptq(weight, 4, 32, sym=False, zero_offset=1)
    assert int(v1.qzeros[0, 0]) == -1  # every nibble 0xF
    for zero_offset, tensors in ((1, v1), (0, quantize_gptq(weight, 4, 32, sym=False, zero_offset=0))):
        config = GPTQConfig(bits=4, group_size=32, sym=False, zero_offset=zero_offset)
        spec = LinearSpec("model.layers.0.mlp.down_proj", IN, 64, (64,), False, "float32")
        layer = Linear(spec, GPTQQuantizer(config), GPTQTorchKernel())
        for name, tensor in tensors.state_dict("x").items():
            layer.load_weight(name.removeprefix("x."), tensor)
        x = torch.randn(3, IN)
        torch.testing.assert_close(layer(x), F.linear(x, tensors.dequantized), atol=1e-4, rtol=1e-4)


def test_bfloat16_compute():
    layer, weight = _fused_layer(GPTQConfig(bits=4, group_size=64), dtype="bfloat16")
    x = torch.randn(4, IN, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight), atol=0.05, rtol=0.02)


def test_tiles_cover_every_column(monkeypatch):
    layer, weight = _fused_layer(GPTQConfig(bits=3, group_size=32))
    monkeypatch.setattr(GPTQTorchKernel, "tile_elements", IN * 40)  # 32-column tiles
    x = torch.randn(3, IN)
    torch.testing.assert_close(layer(x), F.linear(x, weight), atol=1e-4, rtol=1e-4)


def test_packed_storage_is_a_fraction_of_float32():
    layer, _ = _fused_layer(GPTQConfig(bits=4, group_size=128))
    stored = sum(p.numel() * p.element_size() for p in layer.parameters())
    assert stored <= 0.2 * 4 * IN * sum(QKV)


def test_fused_shards_with_different_g_idx_are_refused():
    config = GPTQConfig(bits=4, group_size=32, desc_act=True)
    spec = LinearSpec("model.layers.0.self_attn.qkv_proj", IN, sum(QKV), QKV, False, "float32")
    layer = Linear(spec, GPTQQuantizer(config), GPTQTorchKernel())
    first = quantize_gptq(torch.randn(QKV[0], IN), 4, 32, act_order=torch.randperm(IN))
    second = quantize_gptq(torch.randn(QKV[1], IN), 4, 32, act_order=torch.randperm(IN))
    layer.load_weight("g_idx", first.g_idx, 0)
    with pytest.raises(ValueError, match="different g_idx"):
        layer.load_weight("g_idx", second.g_idx, 1)
    with pytest.raises(ValueError, match="outside 0..7"):
        layer.load_weight("g_idx", torch.full((IN,), 8, dtype=torch.int32), 2)


def test_shapes_that_do_not_pack_are_refused():
    quantizer = GPTQQuantizer(GPTQConfig(bits=3))
    with pytest.raises(ValueError, match="a shard of 48 outputs does not pack into whole 3-bit words"):
        Linear(LinearSpec("m.qkv_proj", IN, 96, (48, 48), False, "float32"), quantizer, GPTQTorchKernel())
    with pytest.raises(ValueError, match="100 inputs do not pack"):
        Linear(LinearSpec("m.down_proj", 100, 64, (64,), False, "float32"), quantizer, GPTQTorchKernel())


def test_config_parsing_and_detection(tmp_path):
    hf = {"quantization_config": {"quant_method": "gptq", "bits": 3, "group_size": -1, "desc_act": True,
                                  "sym": False, "checkpoint_format": "gptq_v2"}}
    assert GPTQQuantizer.detect(hf, str(tmp_path)) == 1.0
    assert GPTQQuantizer.detect({"quantization_config": {"quant_method": "awq"}}, str(tmp_path)) == 0.0
    assert GPTQQuantizer.detect({}, str(tmp_path)) == 0.0
    quantizer = GPTQQuantizer.from_config(hf, str(tmp_path))
    assert quantizer.config == GPTQConfig(bits=3, group_size=-1, desc_act=True, sym=False, zero_offset=0)
    assert quantizer.describe() == "gptq 3-bit per-channel asym desc_act v2 zeros"
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 8, "group_size": 64}))
    assert GPTQQuantizer.detect({}, str(tmp_path)) == 1.0
    assert GPTQQuantizer.from_config({}, str(tmp_path)).config.bits == 8


@pytest.mark.parametrize("field, value, message", [
    ("bits", 5, "bits=5 is not supported"),
    ("group_size", 0, "group_size=0 must be a positive integer or -1"),
    ("checkpoint_format", "marlin", "Marlin-repacked"),
    ("dynamic", {"-:.*lm_head": {}}, "'dynamic' per-module overrides"),
])
def test_bad_configs(field, value, message, tmp_path):
    hf = {"quantization_config": {"quant_method": "gptq", field: value}}
    with pytest.raises(ValueError, match=message):
        GPTQQuantizer.from_config(hf, str(tmp_path))


def test_lm_head_and_excluded_modules_stay_full_precision():
    quantizer = GPTQQuantizer(GPTQConfig(modules_to_not_convert=("mlp.down_proj",)))
    assert not quantizer.is_quantized(LinearSpec("lm_head", 64, 128, (128,), False, "float32"))
    assert not quantizer.is_quantized(LinearSpec("model.layers.1.mlp.down_proj", 64, 64, (64,), False, "float32"))
    assert quantizer.is_quantized(LinearSpec("model.layers.1.mlp.gate_up_proj", 64, 128, (64, 64), False, "float32"))
    assert GPTQQuantizer(GPTQConfig(lm_head=True)).is_quantized(LinearSpec("lm_head", 64, 128, (128,), False, "float32"))


@pytest.mark.parametrize("bits, group_size, desc_act", [(4, 32, True), (3, -1, False), (8, 64, False)])
def test_tiny_llama_matches_transformers(checkpoints, bits, group_size, desc_act):
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": True}
    perms = {}

    def quantize(name, weight):
        parent, _, leaf = name.rpartition(".")
        shared_input = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
        key = f"{parent}.{shared_input.get(leaf, leaf)}"  # fused shards share one act-order permutation
        perm = perms.setdefault(key, torch.randperm(weight.shape[1])) if desc_act else None
        tensors = quantize_gptq(weight, bits, group_size, act_order=perm)
        return tensors.state_dict(name), tensors.dequantized

    tokens = [3, 17, 99, 4, 56, 23, 8, 101, 77]
    kernels = checkpoints.kernels_matching_transformers(quantize, qc, GPTQQuantizer, tokens)
    assert kernels == {"gptq-torch": 8, "torch-linear": 1}
