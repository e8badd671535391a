"""The whole chain (platform -> dtype -> attention per layer type -> format -> kernels) on a
checkpoint config, and the rendered startup report."""

import json

import pytest

from tokenmill.discovery import ModelDescription, PluginRegistry, SelectionError, SelectionRequest, select
from tokenmill.plugin_api import (
    AttentionBackend,
    AttentionCapabilities,
    DeviceInfo,
    Platform,
    PlatformCapabilities,
    ProbeResult,
    Quantizer,
    QuantKernel,
)

CONFIG = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 96,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 500, "sliding_window": 128,
          "layer_types": ["sliding_attention", "full_attention"], "attn_logit_softcapping": 50.0,
          "query_pre_attn_scalar": 16, "torch_dtype": "bfloat16"}


class SimulatedGpu(Platform):
    name = "gpu"
    device_type = "cuda"
    api_version = (2, 0)
    activated = []

    @classmethod
    def probe(cls):
        return ProbeResult(100, ("2 simulated GPUs",), (DeviceInfo(0, "sim 0"), DeviceInfo(1, "sim 1")))

    @property
    def capabilities(self):
        return PlatformCapabilities(dtypes=("bfloat16", "float16"))

    def activate(self):
        SimulatedGpu.activated.append(self.device_index)

    def attention_preference(self):
        return ("windowless", "reference")

    def quant_kernel_preference(self):
        return ("fast",)


class WindowlessBackend(AttentionBackend):
    name = "windowless"
    api_version = (2, 0)
    capabilities = AttentionCapabilities(device_types=("cuda",), sliding_window=False)


class ReferenceBackend(AttentionBackend):
    name = "reference"
    api_version = (2, 0)
    capabilities = AttentionCapabilities(device_types=("cpu", "cuda"))


class FastKernel(QuantKernel):
    name = "fast"

    @classmethod
    def supports(cls, quantizer, spec, device_type, caps):
        return None if spec.out_features % 128 == 0 else f"out_features {spec.out_features} not a multiple of 128"


class TorchKernel(QuantKernel):
    name = "torch"


class PackedFormat(Quantizer):
    name = "packed"
    api_version = (2, 0)

    @classmethod
    def detect(cls, hf_config, model_path):
        return 1.0 if model_path.endswith(".packed.gguf") else 0.0

    def kernels(self):
        return (TorchKernel, FastKernel)

    def hf_config(self, model_path):
        return dict(CONFIG)

    def describe(self):
        return "packed 4-bit"


class Unquantized(Quantizer):
    name = "unquantized"
    api_version = (2, 0)

    def kernels(self):
        return (TorchKernel,)


def registry(**extra):
    return PluginRegistry.make_test_instance(platforms=[SimulatedGpu], attention_backends=[WindowlessBackend, ReferenceBackend],
                                             quantizers=[PackedFormat, Unquantized], include_core=False, **extra)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return str(tmp_path)


def test_the_model_description_reads_shapes_and_layer_types(model_dir):
    model = ModelDescription.load(registry(), model_dir)
    assert model.checkpoint_dtype == "bfloat16" and model.source == "config.json"
    specs = model.attention_specs("bfloat16")
    assert set(specs) == {"full_attention", "sliding_attention"}
    full, sliding = specs["full_attention"], specs["sliding_attention"]
    assert (full.num_heads, full.num_kv_heads, full.head_size, full.scale) == (4, 2, 32, 0.25)
    assert full.sliding_window is None and sliding.sliding_window == 128 and full.logits_soft_cap == 50.0
    shapes = [(s.prefix.rsplit(".", 1)[-1], s.in_features, s.out_features, s.output_sizes) for s in model.linear_specs("bfloat16")]
    assert shapes == [("qkv_proj", 64, 256, (128, 64, 64)), ("o_proj", 128, 64, (64,)),
                      ("gate_up_proj", 64, 192, (96, 96)), ("down_proj", 96, 64, (64,)), ("lm_head", 64, 500, (500,))]


def test_full_chain_and_report(model_dir):
    SimulatedGpu.activated.clear()
    report = select(registry(), SelectionRequest(device="gpu:1"), ModelDescription.load(registry(), model_dir))
    assert SimulatedGpu.activated == [1] and report.dtype == "bfloat16"
    assert report.attention["full_attention"].name == "windowless"
    sliding = report.attention["sliding_attention"]
    assert sliding.name == "reference"
    assert [(r.name, r.reasons) for r in sliding.rejections] == [("windowless", ("sliding-window attention not supported",))]
    assert report.quantizer.name == "unquantized"
    assert [k.name for k in report.kernels] == ["torch"] * 5

    text = report.render()
    assert "platform: gpu (cuda:1), device 1 (score 100, pinned by --device gpu:1)" in text
    assert "dtype: bfloat16 (the checkpoint's dtype)" in text
    assert "attention backend for sliding attention layers: reference" in text
    assert "rejected windowless: sliding-window attention not supported" in text
    assert "note: no quantization format recognised the checkpoint; treating it as unquantized" in text


def test_gguf_style_file_config_comes_from_the_quantizer(tmp_path):
    checkpoint = tmp_path / "tiny.packed.gguf"
    checkpoint.write_bytes(b"GGUF")
    reg = registry()
    model = ModelDescription.load(reg, str(checkpoint))
    assert model.source == "packed metadata" and model.hf_config["hidden_size"] == 64
    report = select(reg, SelectionRequest(dtype="float16"), model)
    assert report.dtype == "float16" and report.quantizer.name == "packed"
    kernels = {k.spec.prefix.rsplit(".", 1)[-1]: k for k in report.kernels}
    assert kernels["qkv_proj"].name == "fast" and kernels["qkv_proj"].rejections == ()
    assert kernels["o_proj"].name == "torch"
    assert kernels["o_proj"].rejections[0].reasons == ("out_features 64 not a multiple of 128",)
    assert "quantization: packed 4-bit (confidence 1.00)" in report.render()


def test_a_gguf_file_nobody_recognises_is_a_clear_error(tmp_path):
    checkpoint = tmp_path / "other.gguf"
    checkpoint.write_bytes(b"GGUF")
    with pytest.raises(SelectionError, match=r"quantized as gguf \(other.gguf has the GGUF header\) and no loaded "
                                             r"quantizer claims it.*: install tokenmill-quant-gguf"):
        ModelDescription.load(registry(), str(checkpoint))
    (tmp_path / "plain.gguf").write_bytes(b"NOPE")
    with pytest.raises(SelectionError, match="cannot read a model config from .*plain.gguf"):
        ModelDescription.load(registry(), str(tmp_path / "plain.gguf"))


def test_errors_for_bad_model_paths_and_dtypes(tmp_path, model_dir):
    with pytest.raises(SelectionError, match="without a config.json"):
        ModelDescription.load(registry(), str(tmp_path / ".."))
    with pytest.raises(SelectionError, match="expected a model directory"):
        ModelDescription.load(registry(), str(tmp_path / "missing.bin"))
    with pytest.raises(SelectionError, match="--dtype float32: the platform computes bfloat16, float16"):
        select(registry(), SelectionRequest(dtype="float32"), ModelDescription.load(registry(), model_dir))


def test_platform_only_selection_needs_no_model():
    report = select(registry(), SelectionRequest())
    assert report.platform.name == "gpu" and report.attention == {} and "platform: gpu" in report.render()
