"""The transformers fallback: GPT-2 and OPT (no native implementation) run through their own
transformers modeling code with tokenmill's paged attention — logits against HF through the paged
harness, greedy output through LLM in a continuously batched mix of prefills and decodes against
HF's own argmax loop, the resolution log line, and the step-context guard."""

import logging

import hf_parity as parity
import pytest
import torch
from transformers import GPT2Config, OPTConfig

VOCAB = 160
CONFIGS = {
    "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                               initializer_range=0.15, bos_token_id=0, eos_token_id=0),
    "opt": lambda: OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=96, num_attention_heads=4,
                             max_position_embeddings=128, word_embed_proj_dim=64, init_std=0.15),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            hf = parity.save_tiny(CONFIGS[name](), path)
            parity.save_word_tokenizer(path, VOCAB)
            made[name] = (path, hf)
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CONFIGS))
def test_paged_logits_match_hf(checkpoints, name):
    path, hf = checkpoints(name)
    runner = parity.check_prefill(path, hf)
    assert type(runner.model).__name__ == "TransformersCausalLM"
    parity.check_decode(path, hf, steps=8)


def hf_greedy(hf, prompt: list[int], num_tokens: int) -> list[int]:
    """HF's plain argmax loop with its own KV cache."""
    from transformers import DynamicCache

    cache, tokens, out = DynamicCache(config=hf.config), list(prompt), []
    feed = tokens
    for _ in range(num_tokens):
        logits = parity.hf_step(hf, feed, cache)
        cache = logits.past_key_values
        token = int(logits.logits[0, -1].argmax())
        out.append(token)
        feed = [token]
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_llm_greedy_batch_matches_hf(checkpoints, name, caplog):
    from tokenmill import LLM, SamplingParams

    path, hf = checkpoints(name)
    with caplog.at_level(logging.INFO, logger="tokenmill"):
        # a 16-token budget splits the long prompts into chunks that share steps with decodes
        llm = LLM(str(path), dtype="float32", kv_cache_memory="64MiB", max_num_batched_tokens=16)
    arch = type(hf).__name__
    assert f"no native implementation for {arch}: using the transformers fallback" in caplog.text
    prompts = parity.prompts(VOCAB, [5, 37, 12, 3, 26], seed=4)
    lengths = [12, 6, 16, 9, 14]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, n, output in zip(prompts, lengths, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(hf, prompt, n)


def test_explain_names_the_fallback(checkpoints):
    from tokenmill.discovery import ModelDescription, discover

    path, _ = checkpoints("gpt2")
    description = ModelDescription.load(discover(), str(path))
    assert description.implementation() == "GPT2LMHeadModel (transformers fallback: no native implementation)"
    assert description.text_config["hidden_size"] == 64  # GPT-2's n_embd under its standard name


def test_step_binding_forbids_nesting_and_unbound_use():
    from tokenmill.models.transformers_attention import StepBinding

    binding = StepBinding()
    with pytest.raises(RuntimeError, match="outside a tokenmill step"):
        binding.ctx  # noqa: B018
    with binding.bind("step-1"):
        assert binding.ctx == "step-1"
        with pytest.raises(RuntimeError, match="already running a step"):
            with binding.bind("step-2"):
                pass
        assert binding.ctx == "step-1"
    with pytest.raises(RuntimeError):
        binding.ctx  # noqa: B018


def test_unwired_module_is_refused():
    from tokenmill.models.transformers_attention import paged_attention_forward

    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="not wired to tokenmill's paged attention"):
        paged_attention_forward(torch.nn.Linear(1, 1), q, q, q, None)
