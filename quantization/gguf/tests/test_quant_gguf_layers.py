"""GGUF linear layers through core's Linear: both layouts, fused shards of mixed ggml types, row
tiling, mode selection and the errors a wrong checkpoint produces."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_gguf.dequantize import dequantize
from tokenmill_quant_gguf.dequantized_kernel import GGUFDequantizedKernel
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.packed_kernel import GGUFPackedTorchKernel
from tokenmill_quant_gguf.quantizer import MODE_ENV, GGUFQuantizer

T = gguf.GGMLQuantizationType
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 256, 4, 2, 64, 512
QKV_SIZES = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM)
SHARD_TYPES = {"attn_q": T.Q4_K, "attn_k": T.Q4_K, "attn_v": T.Q6_K, "ffn_gate": T.Q5_0, "ffn_up": T.Q5_0,
               "ffn_down": T.Q3_K, "attn_output": T.Q2_K}
SHAPES = {"attn_q": (QKV_SIZES[0], HIDDEN), "attn_k": (QKV_SIZES[1], HIDDEN), "attn_v": (QKV_SIZES[2], HIDDEN),
          "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN), "ffn_down": (HIDDEN, INTER),
          "attn_output": (HIDDEN, HEADS * HEAD_DIM)}
SPECS = {
    "qkv": LinearSpec("model.layers.0.self_attn.qkv_proj", HIDDEN, sum(QKV_SIZES), QKV_SIZES, True, "float32"),
    "gate_up": LinearSpec("model.layers.0.mlp.gate_up_proj", HIDDEN, 2 * INTER, (INTER, INTER), False, "float32"),
    "down": LinearSpec("model.layers.0.mlp.down_proj", INTER, HIDDEN, (HIDDEN,), False, "float32"),
    "o": LinearSpec("model.layers.0.self_attn.o_proj", HEADS * HEAD_DIM, HIDDEN, (HIDDEN,), False, "float32"),
}
LEAF_TO_KEY = {"qkv_proj": "qkv", "gate_up_proj": "gate_up", "down_proj": "down", "o_proj": "o"}
CHECKPOINT_MODULES = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",),
                      "o": ("o_proj",)}


@pytest.fixture
def layer_file(gguf_fixtures, rng) -> str:
    tensors = {}
    for stem, qtype in SHARD_TYPES.items():
        values = rng.standard_normal(SHAPES[stem]).astype(np.float32)
        tensors[f"blk.0.{stem}.weight"] = (gguf_fixtures.encode(values, qtype, rng), qtype)
    metadata = {"llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS}
    return gguf_fixtures.write(tensors, metadata=metadata)


def _build(quantizer: GGUFQuantizer, spec: LinearSpec, kernel_cls) -> Linear:
    """A core Linear loaded the way the model loader does: shard by shard, under the yielded names."""
    layer = Linear(spec, quantizer, kernel_cls())
    weights = dict(quantizer.weights(quantizer._checkpoint.path))
    parent, _, leaf = spec.prefix.rpartition(".")
    modules = CHECKPOINT_MODULES[LEAF_TO_KEY[leaf]]
    for index, module in enumerate(modules):
        for suffix in ("weight", "qweight"):
            name = f"{parent}.{module}.{suffix}"
            if name in weights:
                layer.load_weight(suffix, weights[name], index if len(modules) > 1 else None)
    layer.process_weights_after_loading()
    return layer


def _reference_weight(quantizer: GGUFQuantizer, spec_key: str) -> torch.Tensor:
    checkpoint = quantizer._checkpoint
    prefix = SPECS[spec_key].prefix.rpartition(".")[0]
    parts = [checkpoint.dequantized(checkpoint.gguf_name(f"{prefix}.{m}.weight")) for m in CHECKPOINT_MODULES[spec_key]]
    return torch.cat(parts)


@pytest.mark.parametrize("spec_key", list(SPECS))
@pytest.mark.parametrize("mode, kernel_cls", [("dequantize", GGUFDequantizedKernel), ("packed", GGUFPackedTorchKernel)])
def test_layer_output_equals_float_matmul(layer_file, spec_key, mode, kernel_cls):
    quantizer = GGUFQuantizer(layer_file, mode)
    spec = SPECS[spec_key]
    layer = _build(quantizer, spec, kernel_cls)
    if spec.bias:
        layer.bias.copy_(torch.randn(spec.out_features))
    x = torch.randn(2, 3, spec.in_features)
    want = F.linear(x, _reference_weight(quantizer, spec_key), layer.bias)
    torch.testing.assert_close(layer(x), want, atol=1e-4, rtol=1e-4)


def test_packed_fused_layer_keeps_mixed_types_per_row_range(layer_file):
    layer = _build(GGUFQuantizer(layer_file, "packed"), SPECS["qkv"], GGUFPackedTorchKernel)
    q, k, v = QKV_SIZES
    assert layer.gguf_segments == ((0, q + k, GGMLType.Q4_K), (q + k, q + k + v, GGMLType.Q6_K))
    assert layer.qweight.shape == (q + k + v, GGMLType.Q6_K.row_bytes(HIDDEN))
    assert not layer.qweight[: q + k, GGMLType.Q4_K.row_bytes(HIDDEN) :].any()  # narrower rows are zero-padded


def test_packed_rows_are_unpermuted_like_the_dequantized_weight(layer_file):
    quantizer = GGUFQuantizer(layer_file, "packed")
    layer = _build(quantizer, SPECS["qkv"], GGUFPackedTorchKernel)
    first, end, ggml_type = layer.gguf_segments[0]
    rows = dequantize(layer.qweight[first:end, : ggml_type.row_bytes(HIDDEN)], ggml_type)
    assert torch.equal(rows, _reference_weight(quantizer, "qkv")[first:end])


def test_packed_kernel_tiles_rows(layer_file, monkeypatch):
    quantizer = GGUFQuantizer(layer_file, "packed")
    layer = _build(quantizer, SPECS["gate_up"], GGUFPackedTorchKernel)
    x = torch.randn(5, HIDDEN)
    calls = []
    monkeypatch.setattr(GGUFPackedTorchKernel, "tile_elements", HIDDEN * 7)  # 7-row tiles, ragged at the end
    monkeypatch.setattr("tokenmill_quant_gguf.packed_kernel.dequantize",
                        lambda data, *args: calls.append(data.shape[0]) or dequantize(data, *args))
    want = F.linear(x, _reference_weight(quantizer, "gate_up"))
    torch.testing.assert_close(layer(x), want, atol=1e-4, rtol=1e-4)
    assert calls == [7] * (2 * INTER // 7) + [2 * INTER % 7]


def test_packed_kernel_in_bfloat16(layer_file):
    quantizer = GGUFQuantizer(layer_file, "packed")
    spec = LinearSpec(SPECS["down"].prefix, INTER, HIDDEN, (HIDDEN,), False, "bfloat16")
    layer = _build(quantizer, spec, GGUFPackedTorchKernel)
    x = torch.randn(4, INTER, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    want = F.linear(x.float(), _reference_weight(quantizer, "down"))
    torch.testing.assert_close(out.float(), want, atol=0.5, rtol=0.05)


def test_packed_storage_is_a_fraction_of_float32(layer_file):
    quantizer = GGUFQuantizer(layer_file, "packed")
    layer = _build(quantizer, SPECS["gate_up"], GGUFPackedTorchKernel)
    assert layer.qweight.numel() <= 0.35 * 4 * 2 * INTER * HIDDEN  # Q5_0: 22 bytes per 32 weights


def test_auto_mode_follows_the_selected_kernel(layer_file):
    quantizer = GGUFQuantizer(layer_file, "auto")
    packed = _build(quantizer, SPECS["gate_up"], GGUFPackedTorchKernel)
    plain = _build(quantizer, SPECS["down"], GGUFDequantizedKernel)
    assert packed.qweight.dtype == torch.uint8 and "weight" not in packed._parameters
    assert plain.weight.dtype == torch.float32 and "qweight" not in plain._parameters
    names = {name for name, _ in quantizer.weights(layer_file)}
    assert "model.layers.0.mlp.gate_proj.qweight" in names and "model.layers.0.mlp.down_proj.weight" in names


def test_mode_from_environment_and_config(layer_file, monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    assert GGUFQuantizer.from_config({}, layer_file).mode == "auto"
    assert GGUFQuantizer.from_config({"quantization_config": {"gguf_mode": "packed"}}, layer_file).mode == "packed"
    monkeypatch.setenv(MODE_ENV, "dequantize")
    assert GGUFQuantizer.from_config({"quantization_config": {"gguf_mode": "packed"}}, layer_file).mode == "dequantize"
    monkeypatch.setenv(MODE_ENV, "fast")
    with pytest.raises(ValueError, match="GGUF mode 'fast' is not one of auto, dequantize, packed"):
        GGUFQuantizer.from_config({}, layer_file)


def test_kernels_refuse_the_other_pinned_layout(layer_file):
    caps, spec = PlatformCapabilities(), SPECS["down"]
    packed, dequantized = GGUFQuantizer(layer_file, "packed"), GGUFQuantizer(layer_file, "dequantize")
    assert "packed layout" in GGUFDequantizedKernel.supports(packed, spec, "cpu", caps)
    assert "dequantize at load" in GGUFPackedTorchKernel.supports(dequantized, spec, "cpu", caps)
    auto = GGUFQuantizer(layer_file, "auto")
    assert GGUFDequantizedKernel.supports(auto, spec, "cpu", caps) is None
    assert GGUFPackedTorchKernel.supports(auto, spec, "cpu", caps) is None


def test_is_quantized_only_for_layers_in_the_file(layer_file):
    quantizer = GGUFQuantizer(layer_file)
    assert quantizer.is_quantized(SPECS["qkv"])
    assert not quantizer.is_quantized(LinearSpec("lm_head", HIDDEN, 100, (100,), False, "float32"))


@pytest.mark.parametrize("embedding_type, head_stored, mode, expected", [
    (T.Q8_0, False, "packed", True),
    (T.Q8_0, False, "dequantize", False),
    (T.Q8_0, False, "auto", False),
    (T.F16, False, "packed", False),  # a float embedding is shared, not copied
    (T.Q8_0, True, "packed", False),  # an untied head has its own output.weight
])
def test_a_tied_head_is_packed_only_from_a_quantized_embedding(gguf_fixtures, rng, embedding_type, head_stored,
                                                                mode, expected):
    vocab = 64
    values = rng.standard_normal((vocab, HIDDEN)).astype(np.float32)
    tensors = {"token_embd.weight": (gguf_fixtures.encode(values, embedding_type, rng), embedding_type)}
    if head_stored:
        tensors["output.weight"] = (gguf_fixtures.encode(values, T.Q8_0, rng), T.Q8_0)
    quantizer = GGUFQuantizer(gguf_fixtures.write(tensors), mode)
    head = LinearSpec("lm_head", HIDDEN, vocab, (vocab,), False, "float32")
    assert quantizer.quantizes_tied_lm_head(head) is expected
    assert quantizer.is_quantized(head)  # either way the file holds the head's rows


def test_shape_mismatch_names_the_tensor(layer_file):
    quantizer = GGUFQuantizer(layer_file)
    wrong = LinearSpec(SPECS["down"].prefix, INTER, 2 * HIDDEN, (2 * HIDDEN,), False, "float32")
    with pytest.raises(ValueError, match=r"'blk.0.ffn_down.weight' has shape \(256, 512\).*expects \(512, 512\)"):
        Linear(wrong, quantizer, GGUFDequantizedKernel())


def test_packed_loader_rejects_a_wrong_shard(layer_file):
    quantizer = GGUFQuantizer(layer_file, "packed")
    layer = Linear(SPECS["qkv"], quantizer, GGUFPackedTorchKernel())
    with pytest.raises(ValueError, match="shard 2 expects Q6_K blocks"):
        layer.load_weight("qweight", torch.zeros(QKV_SIZES[2], 144, dtype=torch.uint8), 2)


def test_create_weights_needs_a_checkpoint():
    with pytest.raises(ValueError, match="no checkpoint"):
        GGUFQuantizer().create_weights(torch.nn.Module(), SPECS["down"])
