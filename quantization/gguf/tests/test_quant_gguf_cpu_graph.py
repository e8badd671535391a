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

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.request import Request
from tokenmill.runner.graph_runner import DecodeGraphRunner
from tokenmill.runner.model_runner import ModelRunner
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig
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


def load(path: str, mode: str | None):
    platform = cpu_platform.CpuPlatform()
    quantizer = GGUFQuantizer(path, mode) if mode else None
    build = ModelBuildContext.for_platform(platform, dtype=torch.float32, quantizer=quantizer, block_size=BLOCK_SIZE,
                                           attention_backend=CpuAttentionBackend)
    model = build_model(quantizer.hf_config(path) if quantizer else LlamaConfig(**CONFIG), build)
    load_weights(model, path, quantizer)
    return model, build


def make_runner(model) -> ModelRunner:
    return ModelRunner(model, CpuAttentionBackend(), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                       max_num_batched_tokens=64, max_num_seqs=8, max_model_len=MAX_MODEL_LEN,
                       vocab_size=CONFIG["vocab_size"], device=torch.device("cpu"))


def attach(runner: ModelRunner, max_num_seqs: int) -> DecodeGraphRunner:
    runner.decode_graphs = DecodeGraphRunner(
        runner.model, runner.backend, runner.kv_caches, max_num_seqs=max_num_seqs,
        max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=BLOCK_SIZE, device=runner.device,
        new_graph=CpuDecodeGraph)
    return runner.decode_graphs


@pytest.fixture
def tiny_gguf(gguf_fixtures) -> str:
    torch.manual_seed(0)
    return gguf_fixtures.from_hf_model(AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)), "llama", q4_1_and_q8_0)


def test_packed_decode_graphs_replay_the_eager_steps(tiny_gguf):
    model, build = load(tiny_gguf, "packed")
    assert set(build.kernel_summary()) == {"gguf-packed-cpu"}
    plain, graphed = make_runner(model), make_runner(model)
    graphs = attach(graphed, max_num_seqs=4)
    assert graphs.capture()
    assert graphs.buckets == (1, 2, 4)
    # per layer: two norms, three matmuls... every one a native call; more per replay than layers
    assert all(graph.num_calls > 10 * CONFIG["num_hidden_layers"] for graph in graphs.graphs.values())

    replayed = run_beside_eager(plain, graphed, graphs)
    assert {1, 2, 3} <= set(replayed), replayed  # 6 requests finish one by one


def test_dequantized_layers_run_the_platforms_onednn_linear_in_the_dequantized_layout(tiny_gguf):
    model, build = load(tiny_gguf, "auto")
    # 4 per layer stand in for gguf-dequantized; the head tied to the float embedding is full precision
    assert build.kernel_summary() == {"gguf-dequantized+onednn-linear": 8, "onednn-linear": 1}
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.kernel, GGUFDequantizedKernel) and qkv.weight.dtype == torch.float32
    for rows in (1, 2, 5, 300):  # the small-batch products, the panels, oneDNN
        x = torch.randn(rows, CONFIG["hidden_size"])
        torch.testing.assert_close(qkv(x), torch.nn.functional.linear(x, qkv.weight), atol=1e-4, rtol=1e-4)  # bf16x3 on AMX


def run_beside_eager(plain: ModelRunner, graphed: ModelRunner, graphs: DecodeGraphRunner) -> list[int]:
    """Drive both runners through the same schedule; every step's tokens, logprobs and cache must
    match. Returns the batch sizes of the steps the graphs took."""
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN,
                                          block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))
    gen = torch.Generator().manual_seed(3)
    for i, max_tokens in enumerate(MAX_TOKENS):
        prompt = torch.randint(2, CONFIG["vocab_size"], (4 + 5 * i,), generator=gen).tolist()
        scheduler.add_request(Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                      ignore_eos=True, logprobs=3)))
    outputs: dict[str, list[int]] = {}
    replayed = []
    while scheduler.has_unfinished_requests():
        step = scheduler.schedule()
        if graphs.accepts(graphed.inputs.build(step.scheduled)):
            replayed.append(len(step.scheduled))
        want, got = plain.execute(step), graphed.execute(step)
        assert got.sampled_token_ids == want.sampled_token_ids
        for request_id, (entry,) in want.logprobs.items():
            (graphed_entry,) = got.logprobs[request_id]
            assert graphed_entry.token_ids == entry.token_ids
            torch.testing.assert_close(graphed_entry.logprobs, entry.logprobs, atol=1e-5, rtol=0)
        for cache_plain, cache_graphed in zip(plain.kv_caches, graphed.kv_caches, strict=True):
            torch.testing.assert_close(cache_graphed[:, 1:], cache_plain[:, 1:], atol=1e-5, rtol=0)  # block 0: padding
        for update in scheduler.update(step, want.sampled_token_ids):
            outputs.setdefault(update.request.request_id, []).extend(update.new_token_ids)
    assert sorted(len(tokens) for tokens in outputs.values()) == sorted(MAX_TOKENS)
    return replayed

    assert {1, 2, 3} <= set(replayed), replayed  # 6 requests finish one by one


def native_dense_matmul_offered() -> bool:
    from tokenmill_cpu.layer_kernels import layer_ops_unavailable
    from tokenmill_cpu.panel_matmul import load_panel_matmul
    from tokenmill_cpu.small_batch_linear import load_small_batch_matmul

    return (layer_ops_unavailable() is None and load_small_batch_matmul().offered
            and bool(load_panel_matmul().panel_matmul_offered()))


@pytest.mark.skipif(not native_dense_matmul_offered(), reason="the native float32 matmuls are offered on AVX-512 and AVX2 + FMA builds only")
def test_a_dense_model_captures_every_batch_size_through_the_native_matmuls(tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).save_pretrained(tmp_path)
    model, build = load(str(tmp_path), None)
    plain, graphed = make_runner(model), make_runner(model)
    graphs = attach(graphed, max_num_seqs=8)
    assert graphs.capture()
    assert graphs.buckets == (1, 2, 4, 8)  # one and two rows: the small-batch matmul; more: the panels
    replayed = run_beside_eager(plain, graphed, graphs)
    assert {1, 2, 3} <= set(replayed), replayed
