"""tokenmill.quantize's checkpoint handling: which tensors count as decoder linears, what the
writer copies and how it shards, calibration windows cut from text, and the format registry
(which quantizers write checkpoints, which options each takes)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tokenmill.discovery import PluginRegistry
from tokenmill.plugin_api import Quantizer
from tokenmill.plugin_api.quantize_tools import FloatCheckpoint, calibration_windows, write_checkpoint
from tokenmill.plugin_api.quantize_tools import calibration_text as builtin_text
from tokenmill.quantize import format_options, quantize_model

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture
def tiny(tmp_path):
    directory = tmp_path / "float"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(directory)
    (directory / "tokenizer.json").write_text("{}")
    (directory / "special_tokens_map.json").write_text("{}")
    return directory


def test_linear_weights_are_the_decoder_projections(tiny):
    source = FloatCheckpoint(tiny)
    names = source.linear_weights()
    assert len(names) == 14 and all(n.startswith("model.layers.") and n.endswith("_proj.weight") for n in names)
    assert source.shape("model.layers.1.mlp.down_proj.weight") == (32, 48)
    assert "model.embed_tokens.weight" in source.names() and "lm_head.weight" in source.names()


def test_norms_routers_and_embeddings_stay_float(tmp_path):
    tensors = {"model.layers.0.block_sparse_moe.gate.weight": torch.zeros(4, 8),
               "model.layers.0.block_sparse_moe.experts.0.w1.weight": torch.zeros(16, 8),
               "model.layers.0.post_feedforward_layernorm.weight": torch.zeros(8),
               "model.layers.0.q_norm.weight": torch.zeros(4, 2),
               "model.layers.0.embed_positions.weight": torch.zeros(4, 8),
               "model.norm.weight": torch.zeros(8)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    assert FloatCheckpoint(tmp_path).linear_weights() == ["model.layers.0.block_sparse_moe.experts.0.w1.weight"]


def test_bad_sources(tmp_path, tiny):
    with pytest.raises(ValueError, match="no config.json"):
        FloatCheckpoint(tmp_path)
    config = json.loads((tiny / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq"}
    (tiny / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"already quantized \(awq\)"):
        FloatCheckpoint(tiny)
    save_file({"model.norm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="found no decoder linear weights"):
        FloatCheckpoint(tmp_path).linear_weights()


def test_writer_copies_side_files_and_adds_the_config(tiny, tmp_path):
    source = FloatCheckpoint(tiny)
    out = write_checkpoint(source, tmp_path / "out", source.other_tensors(set()), {"quant_method": "x", "bits": 3})
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "x", "bits": 3} and config["hidden_size"] == 32
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "special_tokens_map.json", "tokenizer.json"]
    written = load_file(str(out / "model.safetensors"))
    assert written.keys() == set(source.names())
    assert torch.equal(written["model.norm.weight"], source.tensor("model.norm.weight"))


def test_writer_shards_with_an_index(tiny, tmp_path):
    source = FloatCheckpoint(tiny)
    out = write_checkpoint(source, tmp_path / "out", source.other_tensors(set()), {"quant_method": "x"},
                           shard_bytes=10_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert not list(out.glob("*.part"))
    assert sorted(index["weight_map"]) == sorted(source.names())
    total = 0
    for file in files:
        for name, tensor in load_file(str(out / file)).items():
            assert index["weight_map"][name] == file and torch.equal(tensor, source.tensor(name))
            total += tensor.numel() * tensor.element_size()
    assert index["metadata"]["total_size"] == total
    # the sharded output reads back as a checkpoint (once its quantization_config is removed)
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    assert FloatCheckpoint(out).names() == [n for f in files for n in load_file(str(out / f))]


def test_writer_refuses_to_overwrite(tiny, tmp_path):
    source = FloatCheckpoint(tiny)
    with pytest.raises(ValueError, match="is the model directory"):
        write_checkpoint(source, tiny, iter(()), {})
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="already holds model weights"):
        write_checkpoint(source, tmp_path / "full", iter(()), {})


def _word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A real (word-level) fast tokenizer over ``words``."""
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(sorted(set(words)))}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def test_calibration_windows_spread_over_the_text():
    words = [f"w{i:03d}" for i in range(100)]
    tokenizer = _word_tokenizer(words)
    windows = calibration_windows(tokenizer, " ".join(words), count=4, length=10)
    assert windows.shape == (4, 10) and windows.dtype == torch.int64
    assert windows[:, 0].tolist() == [1 + i for i in (0, 30, 60, 90)]  # evenly spaced starts, the last ends the text
    assert torch.equal(windows[3], torch.arange(91, 101))
    overlapping = calibration_windows(tokenizer, " ".join(words[:15]), count=3, length=10)
    assert overlapping[:, 0].tolist() == [1, 3, 6]  # starts 0, round(2.5), 5
    with pytest.raises(ValueError, match="fewer than one window"):
        calibration_windows(tokenizer, "w001 w002", count=2, length=10)
    with pytest.raises(ValueError, match="at least one window"):
        calibration_windows(tokenizer, "w001 w002", count=0, length=10)


def test_builtin_calibration_text():
    text = builtin_text()
    assert 2000 < len(text.split()) < 3000 and "\n\n" in text and text.isascii()


class _Writes(Quantizer):
    name = "writes"
    api_version = (2, 0)

    @staticmethod
    def _write(model_dir: str, out_dir: str, *, bits: int = 4, method: str = "rtn") -> dict:
        return {"quant_method": "writes", "bits": bits, "method": method, "from": model_dir, "to": out_dir}

    @classmethod
    @functools.wraps(_write)
    def quantize_checkpoint(cls, model_dir, out_dir, **options):
        return cls._write(model_dir, out_dir, **options)


class _ReadsOnly(Quantizer):
    name = "reads-only"
    api_version = (2, 0)


def test_format_registry_finds_writers_and_checks_options(tmp_path):
    registry = PluginRegistry.make_test_instance(quantizers=[_Writes, _ReadsOnly], include_core=False)
    assert format_options(_Writes) == {"bits": 4, "method": "rtn"}
    config = quantize_model(registry, "writes", "in", tmp_path, bits=8)
    assert config == {"quant_method": "writes", "bits": 8, "method": "rtn", "from": "in", "to": str(tmp_path)}
    with pytest.raises(ValueError, match=r"the writes format does not take --group-size \(it takes: --bits, "
                                         r"--method\)"):
        quantize_model(registry, "writes", "in", tmp_path, group_size=64)
    with pytest.raises(ValueError, match=r"no installed quantization format named 'reads-only' can write "
                                         r"checkpoints \(formats: writes\)"):
        quantize_model(registry, "reads-only", "in", tmp_path)
    with pytest.raises(NotImplementedError, match="cannot write checkpoints"):
        _ReadsOnly.quantize_checkpoint("in", "out")
