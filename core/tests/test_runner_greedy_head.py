"""The greedy shortcut: a step whose rows are all greedy, without logprobs or logits processors, takes
its tokens from the platform's ``greedy_lm_head`` (through the model's ``greedy_token_ids``) instead of
computing every logit; any other step, or a platform that declines, goes through the logits and the
sampler, whose greedy argmax the platform's ``argmax_rows`` may take. Tokens are the same either way."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from tokenmill.layers.context import ModelBuildContext
from tokenmill.layers.embedding import LMHead
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.plugin_api import LayerKernels
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.request import Request
from tokenmill.runner.model_runner import ModelRunner
from tokenmill.sampling.greedy import PREPARE_ROWS
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig

BLOCK_SIZE = 4
NUM_BLOCKS = 64
MAX_MODEL_LEN = 64
CONFIG = dict(vocab_size=150, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=MAX_MODEL_LEN, initializer_range=0.2, rms_norm_eps=1e-5)


class CountingKernels(LayerKernels):
    """Answers ``greedy_lm_head`` (unless ``declines``) and ``argmax_rows`` with torch, counting calls."""

    def __init__(self, declines: bool = False) -> None:
        self.declines = declines
        self.greedy_calls = 0
        self.argmax_calls = 0

    def greedy_lm_head(self, hidden, weight):
        self.greedy_calls += 1
        return None if self.declines else (hidden @ weight.T).argmax(dim=-1)

    def argmax_rows(self, logits):
        self.argmax_calls += 1
        return logits.argmax(dim=-1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG, tie_word_embeddings=True)).save_pretrained(path)
    return str(path)


def _runner(checkpoint: str, kernels: LayerKernels | None) -> ModelRunner:
    build = ModelBuildContext(dtype=torch.float32, block_size=BLOCK_SIZE, attention_backend=ReferenceAttentionBackend,
                              layer_kernels=kernels)
    model = build_model(LlamaConfig(**CONFIG, tie_word_embeddings=True), build)
    load_weights(model, checkpoint)
    return ModelRunner(model, ReferenceAttentionBackend(), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                       max_num_batched_tokens=64, max_num_seqs=8, max_model_len=MAX_MODEL_LEN,
                       vocab_size=CONFIG["vocab_size"], device=torch.device("cpu"), layer_kernels=kernels)


def _generate(runner: ModelRunner, params: list[SamplingParams]) -> dict[str, list[int]]:
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN,
                                          block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))
    gen = torch.Generator().manual_seed(1)
    for i, p in enumerate(params):
        prompt = torch.randint(2, CONFIG["vocab_size"], (5 + 3 * i,), generator=gen).tolist()
        scheduler.add_request(Request(f"r{i}", prompt, p))
    outputs: dict[str, list[int]] = {}
    while scheduler.has_unfinished_requests():
        step = scheduler.schedule()
        result = runner.execute(step)
        for update in scheduler.update(step, result.sampled_token_ids):
            outputs.setdefault(update.request.request_id, []).extend(update.new_token_ids)
    return outputs


GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_greedy_steps_take_the_platforms_argmax_and_the_same_tokens(checkpoint):
    reference = _generate(_runner(checkpoint, None), [GREEDY] * 4)
    kernels = CountingKernels()
    assert _generate(_runner(checkpoint, kernels), [GREEDY] * 4) == reference
    assert kernels.greedy_calls == 6 and kernels.argmax_calls == 0  # one per sampling step, logits never formed


@pytest.mark.parametrize("other", [GREEDY.clone(logprobs=2), SamplingParams(temperature=0.8, max_tokens=6, seed=3,
                                                                              ignore_eos=True),
                                   GREEDY.clone(logit_bias={7: 5.0})])
def test_steps_that_need_logits_go_through_the_sampler(checkpoint, other):
    params = [GREEDY, other, GREEDY]
    reference = _generate(_runner(checkpoint, None), params)
    kernels = CountingKernels()
    assert _generate(_runner(checkpoint, kernels), params) == reference
    assert kernels.greedy_calls == 0


def test_a_platform_that_declines_leaves_the_argmax_to_the_sampler(checkpoint):
    reference = _generate(_runner(checkpoint, None), [GREEDY] * 3)
    kernels = CountingKernels(declines=True)
    assert _generate(_runner(checkpoint, kernels), [GREEDY] * 3) == reference
    assert kernels.greedy_calls == 6 and kernels.argmax_calls == 6


def test_the_lm_head_asks_only_for_a_plain_float32_product(checkpoint):
    kernels = CountingKernels()
    head = _runner(checkpoint, kernels).model.lm_head
    assert isinstance(head, LMHead) and head.kernel.plain_weight
    hidden = torch.randn(3, CONFIG["hidden_size"])
    assert head.greedy_token_ids(hidden).tolist() == head(hidden).argmax(dim=-1).tolist()
    assert head.greedy_token_ids(hidden.double()) is None
    head.kernel = type("Packed", (type(head.kernel),), {"plain_weight": False})()
    assert head.greedy_token_ids(hidden) is None
    assert kernels.greedy_calls == 1


def test_the_runner_prepares_the_greedy_head_on_zero_rows(checkpoint):
    seen = []

    class Recording(CountingKernels):
        def greedy_lm_head(self, hidden, weight):
            seen.append(hidden.clone())
            return super().greedy_lm_head(hidden, weight)

    kernels = Recording()
    runner = _runner(checkpoint, kernels)
    runner.prepare_greedy_head(CONFIG["hidden_size"], torch.float32)
    assert kernels.greedy_calls == 2  # one row, and a batch past small-step paths such as the CPU's int8 one
    assert [h.shape for h in seen] == [(rows, CONFIG["hidden_size"]) for rows in PREPARE_ROWS] and PREPARE_ROWS[0] == 1
    assert all(h.dtype == torch.float32 and not h.any() for h in seen)
    runner.prepare_greedy_head(CONFIG["hidden_size"], torch.bfloat16)  # the head of a float32 model declines it
    runner.prepare_greedy_head(0, torch.float32)  # a config without a hidden size: nothing to prepare
    assert kernels.greedy_calls == 2


def test_building_an_engine_prepares_the_greedy_head(tmp_path, monkeypatch):
    from hf_parity import save_llama

    from tokenmill import LLM

    calls = []
    prepare = ModelRunner.prepare_greedy_head

    def recording(self, hidden_size, dtype):
        calls.append((hidden_size, dtype))
        prepare(self, hidden_size, dtype)

    monkeypatch.setattr(ModelRunner, "prepare_greedy_head", recording)
    llm = LLM(save_llama(tmp_path, seed=0), device="cpu", dtype="float32", kv_cache_memory="8MiB")
    assert calls == [(64, torch.float32)]  # at build, before any request
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], GREEDY, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == GREEDY.max_tokens and len(calls) == 1
