"""Greedy fp32 parity with HF transformers on the real SmolLM2-135M-Instruct, in several engine
configurations: plain batch, prefix caching, 16-token chunked prefill, and preemption."""

from __future__ import annotations

import pytest
import smollm2
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.benchmarks.workloads import chat_prompts, raw_prompts, shared_prefix_prompts

pytestmark = pytest.mark.slow

NUM_TOKENS = 64


@pytest.fixture(scope="module")
def model_dir():
    return str(smollm2.safetensors_dir())


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2.load_tokenizer()


@pytest.fixture(scope="module")
def hf_model():
    return smollm2.load_hf_model()


@pytest.fixture(scope="module")
def mixed_prompts(tokenizer):
    """32 prompts of mixed length: 24 chat prompts (41-118 tokens) and 8 raw ones (4-24 tokens)."""
    chat = smollm2.chat_token_ids(tokenizer, chat_prompts(24))
    raw = [tokenizer(p).input_ids for p in raw_prompts()]
    return chat + raw


def greedy(num_tokens: int = NUM_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)


def run(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def check_parity(hf_model, prompts, actual) -> int:
    """Assert each output equals HF's, or diverges only at a proven near-tie; return exact matches."""
    expected = smollm2.hf_greedy_cached(prompts, NUM_TOKENS, hf_model)
    exact = 0
    for prompt, want, got in zip(prompts, expected, actual, strict=True):
        exact += smollm2.assert_matches_or_near_tie(hf_model, prompt, want, got)
    return exact


def test_plain_batch_matches_hf(model_dir, hf_model, mixed_prompts):
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1GiB", enable_prefix_caching=False)
    exact = check_parity(hf_model, mixed_prompts, run(llm, mixed_prompts))
    assert exact >= len(mixed_prompts) - 2, f"only {exact}/{len(mixed_prompts)} exact (the rest are proven near-ties)"


def test_prefix_caching_matches_hf_and_hits(model_dir, hf_model, tokenizer):
    prompts = smollm2.chat_token_ids(tokenizer, shared_prefix_prompts(16))
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1GiB", enable_prefix_caching=True, max_num_seqs=4)
    check_parity(hf_model, prompts, run(llm, prompts))
    stats = llm.engine.last_stats
    assert stats.prefix_cache_queries > 0
    assert stats.prefix_cache_hits / stats.prefix_cache_queries > 0.3


def test_chunked_prefill_with_16_token_budget_matches_hf(model_dir, hf_model, mixed_prompts):
    prompts = mixed_prompts[::4]
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1GiB", max_num_batched_tokens=16,
              enable_chunked_prefill=True, enable_prefix_caching=False)
    check_parity(hf_model, prompts, run(llm, prompts))


def test_preemption_matches_hf(model_dir, hf_model, mixed_prompts):
    prompts = mixed_prompts[:12]
    # 40 blocks of 16 tokens hold ~4 of these sequences at full length: the rest must wait or be preempted
    llm = LLM(model_dir, dtype="float32", kv_cache_memory=40 * 16 * 46080, max_model_len=256,
              enable_prefix_caching=False)
    check_parity(hf_model, prompts, run(llm, prompts))
    assert llm.engine.last_stats.num_preemptions > 0


@torch.inference_mode()
@pytest.mark.parametrize(("precision", "tolerance"), [("ieee", 1e-4), ("bf16x3", 1e-3)])
def test_logprobs_match_hf_log_softmax(model_dir, hf_model, mixed_prompts, monkeypatch, precision, tolerance):
    """Float32 arithmetic gives HF's logprobs to 1e-4; bf16x3 products (CPUs with AMX) to 1e-3."""
    monkeypatch.setenv("TOKENMILL_CPU_FP32_MATMUL", precision)
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1GiB")
    prompts = mixed_prompts[:3]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=5, prompt_logprobs=3)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        completion = output.outputs[0]
        full = prompt + completion.token_ids
        reference = torch.log_softmax(hf_model(torch.tensor([full])).logits[0].float(), dim=-1)
        for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
            row = reference[len(prompt) - 1 + step]
            assert abs(entry[token].logprob - float(row[token])) < tolerance
            top = torch.topk(row, 5).indices.tolist()
            assert set(top) <= set(entry), (top, list(entry))
        assert output.prompt_logprobs[0] is None
        for position in range(1, len(prompt)):
            entry = output.prompt_logprobs[position]
            token = prompt[position]
            assert abs(entry[token].logprob - float(reference[position - 1, token])) < tolerance


def test_seeded_sampling_is_batch_independent(model_dir, mixed_prompts):
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1GiB")
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate([{"prompt_token_ids": mixed_prompts[0]}], seeded, use_tqdm=False)[0].outputs[0].text
    others = [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.7, seed=7, max_tokens=24, ignore_eos=True)]
    batch = llm.generate([{"prompt_token_ids": p} for p in mixed_prompts[1:4]] + [{"prompt_token_ids": mixed_prompts[0]}],
                         others + [seeded], use_tqdm=False)
    assert batch[-1].outputs[0].text == alone


def test_gguf_served_through_the_plugin_matches_hf_gguf_loading(hf_model, mixed_prompts):
    """The bundled GGUF itself (tokenmill-quant-gguf, dequantized to fp32 at load) against
    HF transformers' own GGUF loading: 32 prompts x 64 greedy tokens."""
    llm = LLM(str(smollm2.gguf_path()), dtype="float32", kv_cache_memory="1GiB")
    assert llm.engine.config.model.quantization == "gguf"
    exact = check_parity(hf_model, mixed_prompts, run(llm, mixed_prompts))
    assert exact >= len(mixed_prompts) - 2, f"only {exact}/{len(mixed_prompts)} exact (the rest are proven near-ties)"


def test_gguf_packed_blocks_on_the_cpu_match_hf_gguf_loading(hf_model, mixed_prompts, monkeypatch):
    """The same GGUF with its Q4_1 blocks kept packed and multiplied in place by the CPU plugin's
    C kernel (GGUF packed mode): the weights are the same floats, only rounding order differs. At
    most 8 requests at a time, so every decode step replays one of the CPU's decode graphs."""
    monkeypatch.setenv("TOKENMILL_GGUF_MODE", "packed")
    llm = LLM(str(smollm2.gguf_path()), dtype="float32", kv_cache_memory="1GiB", max_num_seqs=8)
    kernels = {type(m.kernel).name for m in llm.engine.core.runner.model.modules() if hasattr(m, "kernel")}
    assert "gguf-packed-cpu" in kernels
    graphs = llm.engine.core.runner.decode_graphs
    assert graphs is not None and graphs.buckets == (1, 2, 4, 8)
    exact = check_parity(hf_model, mixed_prompts, run(llm, mixed_prompts))
    assert exact >= len(mixed_prompts) - 2, f"only {exact}/{len(mixed_prompts)} exact (the rest are proven near-ties)"


def test_single_prompts_through_prefill_graphs_match_hf(hf_model, mixed_prompts):
    """Eight prompts (4-118 tokens) one at a time, so each prefill replays the CPU platform's prefill
    graph of its padded length (captured at first use), then decodes through the decode graph of one.
    Without prefix caching, so that each prefill is the whole prompt."""
    llm = LLM(str(smollm2.gguf_path()), dtype="float32", kv_cache_memory="1GiB", enable_prefix_caching=False)
    graphs = llm.engine.core.runner.prefill_graphs
    if graphs is None:
        pytest.skip("this platform offers no prefill graphs (its forward is not native calls only here)")
    expected = smollm2.hf_greedy_cached(mixed_prompts, NUM_TOKENS, hf_model)
    chosen = (0, 3, 7, 11, 15, 19, 24, 28)
    exact = 0
    for index in chosen:
        (output,) = llm.generate([{"prompt_token_ids": mixed_prompts[index]}], greedy(), use_tqdm=False)
        exact += smollm2.assert_matches_or_near_tie(hf_model, mixed_prompts[index], expected[index],
                                                    output.outputs[0].token_ids)
    assert {graphs.bucket_for(len(mixed_prompts[i])) for i in chosen} <= set(graphs.graphs) and not graphs.declined
    assert exact >= len(chosen) - 1, f"only {exact}/{len(chosen)} exact (the rest are proven near-ties)"


def test_speculative_decoding_with_packed_gguf_drafts_matches_hf(hf_model, mixed_prompts):
    """The GGUF in float32, with its own Q4_1 blocks read in place as the draft model (4 tokens a step,
    verified by the float32 model in one forward pass): the tokens are the float32 model's, and a
    draft with the same weights is almost always right."""
    prompts = mixed_prompts[::4]
    llm = LLM(str(smollm2.gguf_path()), dtype="float32", kv_cache_memory="1GiB", max_num_seqs=8,
              speculative_config={"method": "draft_model", "num_speculative_tokens": 4,
                                  "quantization_config": {"gguf_mode": "packed"}})
    proposer = llm.engine.core.runner.proposer
    assert {type(m.kernel).name for m in proposer.model.modules() if hasattr(m, "kernel")} >= {"gguf-packed-cpu"}
    exact = check_parity(hf_model, prompts, run(llm, prompts))
    assert exact >= len(prompts) - 1, f"only {exact}/{len(prompts)} exact (the rest are proven near-ties)"
    stats = llm.engine.core.scheduler.stats()
    assert stats.spec_num_drafts > 0 and stats.spec_acceptance_rate > 0.8
