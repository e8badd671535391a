"""``tokenmill export``: the bundled GGUF written as a float Hugging Face checkpoint, through the GGUF
format's contract (its config, dequantized tensors and tokenizer), that ``tokenmill quantize`` reads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tokenmill.benchmarks.default_model import bundled_model_path
from tokenmill.cli.main import main
from tokenmill.discovery import discover
from tokenmill.discovery.model_description import recognising_quantizers
from tokenmill.plugin_api.quantize_tools import FloatCheckpoint


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The bundled model exported with the default arguments (float32)."""
    out = tmp_path_factory.mktemp("export") / "smollm2-f32"
    assert main(["export", str(out)]) == 0
    return out


def test_export_writes_config_tensors_and_tokenizer(exported, capsys):
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    assert "quantization_config" not in config
    gguf = bundled_model_path()
    (_, record), *_ = recognising_quantizers(discover(), gguf)[0]
    source = dict(record.obj.from_config({}, gguf).weights(gguf))
    with safe_open(str(exported / "model.safetensors"), framework="pt") as handle:
        assert set(handle.keys()) == set(source)
        for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
            written = handle.get_tensor(name)
            assert written.dtype == torch.float32 and torch.equal(written, source[name].float())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(exported))
    assert tokenizer.encode("The quick brown fox") == record.obj.from_config({}, gguf).tokenizer(gguf).encode(
        "The quick brown fox")
    assert tokenizer.chat_template


def test_export_is_what_quantize_reads(exported):
    linear = FloatCheckpoint(exported).linear_weights()
    assert len(linear) == 30 * 7 and "model.layers.29.mlp.down_proj.weight" in linear


def test_export_in_bfloat16(tmp_path):
    assert main(["export", bundled_model_path(), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="pt") as handle:
        assert handle.get_tensor("model.norm.weight").dtype == torch.bfloat16


def test_export_errors_are_one_line(tmp_path, exported, capsys):
    assert main(["export", str(exported / "config.json"), str(tmp_path / "out")]) == 1
    assert main(["export", bundled_model_path(), str(exported)]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("error: ") for line in errors)
    assert "no installed quantization format recognises it" in errors[0]
    assert "already holds model weights" in errors[1]


@pytest.mark.slow
def test_export_generates_what_the_gguf_generates(exported, monkeypatch):
    """Greedy tokens of the float32 export equal those of the GGUF loaded dequantized in float32."""
    from tokenmill import LLM, SamplingParams

    monkeypatch.setenv("TOKENMILL_GGUF_MODE", "dequantize")
    params = SamplingParams(max_tokens=12, temperature=0.0)
    prompt = "The capital of France is"
    outputs = []
    for model in (bundled_model_path(), str(exported)):
        llm = LLM(model=model, dtype="float32", kv_cache_memory="64MiB", device="cpu")
        outputs.append(llm.generate([prompt], params)[0].outputs[0].token_ids)
        del llm
    assert outputs[0] == outputs[1]
