"""Quality acceptance of ``tokenmill quantize`` on the real SmolLM2-135M: perplexity on a fixed
English text (perplexity_text.txt, ~3,200 tokens, written for this test and unrelated to the
built-in calibration text), computed by tokenmill's own engine from prompt log-probabilities over
windows of 512 tokens. fp32 is cross-checked once against transformers' loss on the same windows.
Bounds against fp32: FP8 and INT8 within +1%, 4-bit GPTQ and AWQ within +15%.

Quantized checkpoints are cached by content (see ``quantized_smollm2``); from scratch the three
calibrated ones take about a minute each on a quiet 2-core machine. Measured perplexities are
printed (``pytest -s`` or ``-rP`` shows them).
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

TEXT = Path(__file__).with_name("perplexity_text.txt")
WINDOW = 512

# name: (format, options, bound on perplexity / fp32 perplexity)
CONFIGURATIONS = {
    "fp8 (GPTQ error feedback, per-channel e4m3)": ("fp8", ["--method", "gptq"], 1.01),
    "int8 (W8A16, per-channel)": ("int8", [], 1.01),
    "gptq 4-bit g32 asym act-order": ("gptq", ["--group-size", "32", "--no-sym", "--desc-act"], 1.15),
    "awq 4-bit g32 (scale search)": ("awq", ["--group-size", "32"], 1.15),
}


@pytest.fixture(scope="module")
def windows() -> list[list[int]]:
    import smollm2

    ids = smollm2.load_tokenizer()(TEXT.read_text(encoding="utf-8"), add_special_tokens=False).input_ids
    assert 2500 <= len(ids) <= 4000
    return [ids[start : start + WINDOW] for start in range(0, len(ids), WINDOW)]


def engine_perplexity(directory: Path, windows: list[list[int]]) -> float:
    """exp(mean negative log-likelihood) of every window token after the first, from tokenmill."""
    from tokenmill import LLM, SamplingParams

    llm = LLM(str(directory), dtype="float32", kv_cache_memory="256MiB")
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows], SamplingParams(max_tokens=1, prompt_logprobs=0),
                           use_tqdm=False)
    total = count = 0.0
    for output, window in zip(outputs, windows, strict=True):
        for entry, token in zip(output.prompt_logprobs[1:], window[1:], strict=True):
            total -= entry[token].logprob
            count += 1
    del llm
    gc.collect()
    return math.exp(total / count)


@pytest.fixture(scope="module")
def fp32_perplexity(windows) -> float:
    import smollm2

    perplexity = engine_perplexity(smollm2.safetensors_dir(), windows)
    print(f"\nSmolLM2-135M fp32 perplexity: {perplexity:.4f} ({sum(len(w) - 1 for w in windows)} tokens)")
    return perplexity


def test_fp32_perplexity_matches_transformers(fp32_perplexity, windows):
    import smollm2
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2.safetensors_dir(), dtype=torch.float32).eval()
    total = count = 0.0
    with torch.inference_mode():
        for window in windows:
            tokens = torch.tensor([window])
            total += float(model(tokens, labels=tokens).loss) * (len(window) - 1)
            count += len(window) - 1
    hf = math.exp(total / count)
    print(f"transformers fp32 perplexity: {hf:.4f}")
    assert abs(fp32_perplexity / hf - 1) < 1e-3
    assert 5 < fp32_perplexity < 60  # a sane English perplexity for a 135M model


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_quantized_perplexity_within_bound(name, fp32_perplexity, windows, quantized_model):
    format_name, options, bound = CONFIGURATIONS[name]
    directory = quantized_model(format_name, options)
    perplexity = engine_perplexity(directory, windows)
    ratio = perplexity / fp32_perplexity
    print(f"{name}: perplexity {perplexity:.4f} ({ratio - 1:+.2%} vs fp32 {fp32_perplexity:.4f}; bound "
          f"{bound - 1:+.0%})")
    assert ratio <= bound
