"""Decode graphs with the Triton attention backend, whose plan a captured graph freezes.

On the CPU (Triton interpreted) an eager graph with a frozen plan replays the plan made at capture
on every later step, as a CUDA graph does: the tokens must still match the plain runner's. On a
CUDA machine (the GPU lane of ci/gpu_check.sh) the same comparison runs compiled kernels, and once
more with real CUDA graphs from the CUDA platform.
"""

import os

import pytest
import torch
from transformers import LlamaConfig

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are first imported (by the backend's plan)

from tokenmill.layers.context import ModelBuildContext  # noqa: E402
from tokenmill.loader.model_loader import build_model, load_weights  # noqa: E402
from tokenmill.request import Request  # noqa: E402
from tokenmill.runner.graph_runner import DecodeGraphRunner, EagerDecodeGraph  # noqa: E402
from tokenmill.runner.model_runner import ModelRunner  # noqa: E402
from tokenmill.sampling_params import SamplingParams  # noqa: E402
from tokenmill.scheduler import Scheduler, SchedulerConfig  # noqa: E402

triton_backend = pytest.importorskip("tokenmill_attn_triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
DEVICE = torch.device("cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda")
BLOCK_SIZE = 8
NUM_BLOCKS = 40
MAX_MODEL_LEN = 96
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=MAX_MODEL_LEN, initializer_range=0.15, rms_norm_eps=1e-5)
MAX_TOKENS = (2, 4, 6, 6, 6)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama-triton")
    AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).save_pretrained(path)
    build = ModelBuildContext(dtype=torch.float32, device=DEVICE, block_size=BLOCK_SIZE)
    model = build_model(LlamaConfig(**CONFIG), build)
    load_weights(model, str(path))
    return model


def make_runner(model) -> ModelRunner:
    return ModelRunner(model, triton_backend.TritonAttentionBackend(DEVICE), num_blocks=NUM_BLOCKS,
                       block_size=BLOCK_SIZE, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=MAX_MODEL_LEN,
                       vocab_size=CONFIG["vocab_size"], device=DEVICE)


def generate_side_by_side(model, new_graph) -> dict[str, list[int]]:
    """Greedy generation through a plain runner and a graphed one fed the same steps; tokens must match."""
    plain, graphed = make_runner(model), make_runner(model)
    graphed.decode_graphs = DecodeGraphRunner(
        model, graphed.backend, graphed.kv_caches, max_num_seqs=4, max_blocks_per_seq=graphed.inputs.max_blocks_per_seq,
        block_size=BLOCK_SIZE, device=DEVICE, new_graph=new_graph)
    graphed.decode_graphs.capture()
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN,
                                          block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))
    gen = torch.Generator().manual_seed(5)
    for i, max_tokens in enumerate(MAX_TOKENS):
        prompt = torch.randint(2, CONFIG["vocab_size"], (5 + 3 * i,), generator=gen).tolist()
        scheduler.add_request(Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                      ignore_eos=True, logprobs=2)))
    outputs: dict[str, list[int]] = {}
    graphed_steps = 0
    while scheduler.has_unfinished_requests():
        step = scheduler.schedule()
        graphed_steps += graphed.decode_graphs.accepts(graphed.inputs.build(step.scheduled))
        want, got = plain.execute(step), graphed.execute(step)
        assert got.sampled_token_ids == want.sampled_token_ids
        for request_id, (entry,) in want.logprobs.items():
            torch.testing.assert_close(got.logprobs[request_id][0].logprobs, entry.logprobs, atol=2e-5, rtol=0)
        for update in scheduler.update(step, want.sampled_token_ids):
            outputs.setdefault(update.request.request_id, []).extend(update.new_token_ids)
    assert graphed_steps >= 3  # 3 and 4 decodes (padded to 4); 5 decodes run eagerly
    return outputs


def test_a_frozen_triton_plan_replays_correctly_on_new_inputs(tiny_llama):
    outputs = generate_side_by_side(tiny_llama, lambda: EagerDecodeGraph(freeze_plan=True))
    assert sorted(len(tokens) for tokens in outputs.values()) == sorted(MAX_TOKENS)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA device (compiled Triton kernels)")
def test_cuda_graphs_match_the_plain_runner(tiny_llama):
    from tokenmill_cuda.platform import CudaPlatform

    platform = CudaPlatform(DEVICE.index or 0)
    platform.activate()
    outputs = generate_side_by_side(tiny_llama, platform.create_graph)
    assert sorted(len(tokens) for tokens in outputs.values()) == sorted(MAX_TOKENS)
