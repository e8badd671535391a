"""A tiny GGUF Llama in packed mode on the CPU platform: its whole decode forward is native calls (the
packed C matmul, the CPU layer kernels and attention), so the platform's CpuDecodeGraph records it
and replays the calls alone. Driven step by step beside an eager runner on the same weights, every
sampled token, logprob and cache entry must match. A dense model's linear layers are native too on
AVX-512 CPUs (the small-batch matmul for one or two rows, the panel matmul for more), so it captures
every batch size as well."""

from __future__ import annotations

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenmill_quant_gguf.cpu_kernel import native_unavailable
from tokenmill_quant_gguf.dequantized_kernel import GGUFDequantizedKernel
from tokenmill_quant_gguf.quantizer import GGUFQuantizer

cpu_platform = pytest.importorskip("tokenmill_cpu.platform")
from tokenmill_cpu.attention import CpuAttentionBackend  # noqa: E402
from tokenmill_cpu.decode_graph import CpuDecodeGraph  # noqa: E402

pytestmark = pytest.mark.skipif(native_unavailable() is not None, reason="no C compiler for the native kernels")
T = gguf.GGMLQuantizationType
BLOCK_SIZE = 8
NUM_BLOCKS = 48
MAX_MODEL_LEN = 96
CONFIG = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=MAX_MODEL_LEN, rms_norm_eps=1e-5, initializer_range=0.1,
              tie_word_embeddings=True)
MAX_TOKENS = (3, 5, 8, 11, 13, 15)


def q4_1_and_q8_0(name: str) -> gguf.GGMLQuantizationType:
    return T.Q8_0 if ".attn_v." in name or ".ffn_down." in name or not name.startswith("blk.") else T.Q4_1


def load(harness, path: str, mode: str | None):
    quantizer = GGUFQuantizer(path, mode) if mode else None
    return harness.load(path, quantizer.hf_config(path) if quantizer else LlamaConfig(**CONFIG), quantizer=quantizer,
                        platform=cpu_platform.CpuPlatform(), attention_backend=CpuAttentionBackend,
                        block_size=BLOCK_SIZE)


def beside_eager(harness, model, max_num_seqs: int):
    """The harness's decode graphs (CpuDecodeGraph) beside an eager runner, over six requests of
    growing prompts that finish one by one."""
    gen = torch.Generator().manual_seed(3)
    requests = [(torch.randint(2, CONFIG["vocab_size"], (4 + 5 * i,), generator=gen).tolist(), max_tokens)
                for i, max_tokens in enumerate(MAX_TOKENS)]
    return harness.decode_graphs_beside_eager(model, CpuAttentionBackend(), CpuDecodeGraph, requests,
                                              max_num_seqs=max_num_seqs, block_size=BLOCK_SIZE,
                                              num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN,
                                              vocab_size=CONFIG["vocab_size"])


@pytest.fixture
def tiny_gguf(gguf_fixtures) -> str:
    torch.manual_seed(0)
    return gguf_fixtures.from_hf_model(AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)), "llama", q4_1_and_q8_0)


def test_packed_decode_graphs_replay_the_eager_steps(tiny_gguf, model_harness):
    model, build = load(model_harness, tiny_gguf, "packed")
    assert set(build.kernel_summary()) == {"gguf-packed-cpu"}
    run = beside_eager(model_harness, model, max_num_seqs=4)
    assert run.buckets == (1, 2, 4)
    # per layer: two norms, three matmuls... every one a native call; more per replay than layers
    assert all(calls > 10 * CONFIG["num_hidden_layers"] for calls in run.num_calls)
    assert {1, 2, 3} <= set(run.replayed), run.replayed  # 6 requests finish one by one


def test_dequantized_layers_run_the_platforms_onednn_linear_in_the_dequantized_layout(tiny_gguf, model_harness):
    model, build = load(model_harness, tiny_gguf, "auto")
    # 4 per layer stand in for gguf-dequantized; the head tied to the float embedding is full precision
    assert build.kernel_summary() == {"gguf-dequantized+onednn-linear": 8, "onednn-linear": 1}
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.kernel, GGUFDequantizedKernel) and qkv.weight.dtype == torch.float32
    for rows in (1, 2, 5, 300):  # the small-batch products, the panels, oneDNN
        x = torch.randn(rows, CONFIG["hidden_size"])
        torch.testing.assert_close(qkv(x), torch.nn.functional.linear(x, qkv.weight), atol=1e-4, rtol=1e-4)  # bf16x3 on AMX


def native_dense_matmul_offered() -> bool:
    from tokenmill_cpu.layer_kernels import layer_ops_unavailable
    from tokenmill_cpu.panel_matmul import load_panel_matmul
    from tokenmill_cpu.small_batch_linear import load_small_batch_matmul

    return (layer_ops_unavailable() is None and load_small_batch_matmul().offered
            and bool(load_panel_matmul().panel_matmul_offered()))


@pytest.mark.skipif(not native_dense_matmul_offered(), reason="the native float32 matmuls are offered on AVX-512 and AVX2 + FMA builds only")
def test_a_dense_model_captures_every_batch_size_through_the_native_matmuls(tmp_path, model_harness):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).save_pretrained(tmp_path)
    model, _ = load(model_harness, str(tmp_path), None)
    run = beside_eager(model_harness, model, max_num_seqs=8)
    assert run.buckets == (1, 2, 4, 8)  # one and two rows: the small-batch matmul; more: the panels
    assert {1, 2, 3} <= set(run.replayed), run.replayed
