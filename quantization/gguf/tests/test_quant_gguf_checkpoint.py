"""GGUF checkpoints of tiny random models (llama, qwen2, qwen3, gemma2, gemma3) read exactly as transformers
reads them: the same config, and tensors equal to the state dict of transformers' own GGUF load."""

from __future__ import annotations

import os

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

from tokenmill_quant_gguf.checkpoint import GGUFCheckpoint, find_gguf_file
from tokenmill_quant_gguf.hf_config import CAUSAL_LM_CLASSES
from tokenmill_quant_gguf.quantizer import GGUFQuantizer

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)

CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON, head_dim=16),
    "qwen2": lambda: Qwen2Config(**COMMON),
    # transformers' GGUF config for qwen3 ignores attention.key_length (head_dim falls back to 128)
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=128, tie_word_embeddings=True),
    "gemma2": lambda: Gemma2Config(**COMMON, head_dim=16),
    "gemma3": lambda: Gemma3TextConfig(**COMMON, head_dim=16),
}
QTYPES = {"llama": gguf.GGMLQuantizationType.Q8_0, "qwen2": gguf.GGMLQuantizationType.Q5_1,
          "qwen3": gguf.GGMLQuantizationType.Q4_0, "gemma2": gguf.GGMLQuantizationType.Q8_0,
          "gemma3": gguf.GGMLQuantizationType.Q4_1}


@pytest.fixture(params=list(CONFIGS))
def converted(request, gguf_fixtures):
    """(architecture, GGUF path, transformers' load of that GGUF)."""
    arch = request.param
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[arch]())
    path = gguf_fixtures.from_hf_model(model, arch, QTYPES[arch])
    directory, name = os.path.split(path)
    reference = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    return arch, path, reference


def test_tensors_equal_transformers_gguf_load(converted):
    arch, path, reference = converted
    expected = reference.state_dict()
    quantizer = GGUFQuantizer.from_config({}, path)
    loaded = dict(quantizer.weights(path))
    if reference.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    assert set(loaded) == set(expected)
    for name, tensor in loaded.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, expected[name]), name


def test_hf_config_equals_transformers_derivation(converted):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    arch, path, _ = converted
    expected = load_gguf_checkpoint(path, return_tensors=False)["config"]
    expected.pop("_model_name_or_path")
    ours = GGUFQuantizer.from_config({}, path).hf_config(path)
    assert ours.pop("architectures") == [CAUSAL_LM_CLASSES[expected["model_type"]]]
    if "head_dim" not in expected:
        assert ours.pop("head_dim") == (128 if arch == "qwen3" else 16)
    assert ours == expected


def test_hf_config_matches_transformers(converted):
    arch, path, reference = converted
    config = GGUFQuantizer.from_config({}, path).hf_config(path)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "tie_word_embeddings"):
        assert config[key] == getattr(reference.config, key), key
    assert config["head_dim"] == getattr(reference.config, "head_dim", None) or 16
    assert config["architectures"] == [type(reference).__name__]


def test_qwen3_head_dim_comes_from_key_length(gguf_fixtures):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**COMMON, head_dim=32))
    path = gguf_fixtures.from_hf_model(model, "qwen3", gguf.GGMLQuantizationType.Q8_0)
    assert GGUFQuantizer.from_config({}, path).hf_config(path)["head_dim"] == 32


def test_unpermuted_llama_rows_equal_the_original_model(gguf_fixtures):
    """Beyond agreeing with transformers: q/k come back in the original model's row order."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS["llama"]())
    path = gguf_fixtures.from_hf_model(model, "llama", gguf.GGMLQuantizationType.F32)
    loaded = dict(GGUFQuantizer.from_config({}, path).weights(path))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_find_gguf_file(tmp_path, gguf_fixtures, rng):
    vector = rng.standard_normal(32).astype("float32")
    path = gguf_fixtures.write({"output_norm.weight": (vector, None)}, name="a.gguf")
    assert find_gguf_file(str(tmp_path)) == path
    assert find_gguf_file(path) == path
    gguf_fixtures.write({"output_norm.weight": (vector, None)}, name="b.gguf")
    with pytest.raises(ValueError, match="expected exactly one .gguf file, found a.gguf, b.gguf"):
        find_gguf_file(str(tmp_path))
    with pytest.raises(ValueError, match="no such file"):
        find_gguf_file(str(tmp_path / "missing"))


def test_unsupported_architecture(gguf_fixtures, rng):
    path = gguf_fixtures.write({"output_norm.weight": (rng.standard_normal(32).astype("float32"), None)}, arch="rwkv6")
    with pytest.raises(ValueError, match="GGUF architecture 'rwkv6' is not supported"):
        GGUFCheckpoint(path)


def test_unknown_tensor_name(gguf_fixtures, rng):
    path = gguf_fixtures.write({"blk.0.mystery.weight": (rng.standard_normal(32).astype("float32"), None)})
    with pytest.raises(ValueError, match="'blk.0.mystery.weight' has no Hugging Face counterpart"):
        GGUFCheckpoint(path)


def test_rope_frequency_tensor_is_skipped(gguf_fixtures, rng):
    vector = rng.standard_normal(32).astype("float32")
    path = gguf_fixtures.write({"rope_freqs.weight": (vector, None), "output_norm.weight": (vector, None)})
    assert list(GGUFCheckpoint(path).hf_names()) == [("output_norm.weight", "model.norm.weight")]
