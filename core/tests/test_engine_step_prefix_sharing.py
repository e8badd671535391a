"""Prompts with a common prefix that arrive together: the first request planned in a step computes the
prefix's full blocks and the others in that step attend to them instead of computing their own copies
(a burst of chats with one system prompt). End to end through the scheduler, runner and attention
backends, against the same engine without prefix caching."""

import hf_parity as parity
import pytest

from tokenmill import LLM, SamplingParams

BLOCK = 16
PREFIX = list(range(7, 7 + 2 * BLOCK + 5))  # two full blocks and a partial one
SUFFIXES = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [], [3, 1, 4, 1, 5], [100] * 20]
PROMPTS = [PREFIX + suffix for suffix in SUFFIXES]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return parity.save_llama(tmp_path_factory.mktemp("step-prefix"), seed=0)


def run(model: str, backend: str, prefix_caching: bool):
    llm = LLM(model, device="cpu", dtype="float32", kv_cache_memory="8MiB", block_size=BLOCK,
              attention_backend=backend, enable_prefix_caching=prefix_caching, max_num_seqs=8, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return llm, [o.outputs[0] for o in outputs], [o.num_cached_tokens for o in outputs]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_requests_of_one_step_share_the_prefix_blocks_it_computes(model, backend):
    llm, shared, cached = run(model, backend, prefix_caching=True)
    _, alone, _ = run(model, backend, prefix_caching=False)
    # a fresh engine and one step for every prompt: each hit is a block computed in that same step
    assert cached == [0] + [2 * BLOCK] * (len(PROMPTS) - 1)
    assert llm.engine.last_stats.prefix_cache_hits == 2 * BLOCK * (len(PROMPTS) - 1)
    for got, want in zip(shared, alone, strict=True):
        assert got.token_ids == want.token_ids
        for got_step, want_step in zip(got.logprobs, want.logprobs, strict=True):
            for token, entry in want_step.items():
                assert got_step[token].logprob == pytest.approx(entry.logprob, abs=1e-5)
