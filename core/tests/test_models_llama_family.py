"""Llama, Mistral, Qwen2 and Qwen3 against Hugging Face transformers: tiny random-weight models
saved as safetensors, loaded by tokenmill's loader, run through the reference paged attention on
flat mixed batches, logits compared with HF's own forward (and its KV cache for decoding)."""

import inspect

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.paged_harness import PagedHarness

ATOL = 1e-4
COMMON = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, initializer_range=0.15, rms_norm_eps=1e-5)

CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON, num_hidden_layers=2),
    "llama-llama3-rope-tied": lambda: LlamaConfig(
        **COMMON, num_hidden_layers=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama-head-dim-biases": lambda: LlamaConfig(**COMMON, num_hidden_layers=2, head_dim=24, attention_bias=True,
                                                 mlp_bias=True),
    "mistral-sliding-window": lambda: MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=6),
    "qwen2-sharded-sliding-upper-layers": lambda: Qwen2Config(**COMMON, num_hidden_layers=3, use_sliding_window=True,
                                                              sliding_window=7, max_window_layers=1),
    "qwen3": lambda: Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=32),
}
SHARDED = {"qwen2-sharded-sliding-upper-layers"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (checkpoint dir, HF model), built once per module."""
    made = {}

    def get(name):
        if name not in made:
            torch.manual_seed(0)
            config = CONFIGS[name]()
            hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
            path = tmp_path_factory.mktemp(name)
            hf.save_pretrained(path, safe_serialization=True, max_shard_size="40KB" if name in SHARDED else "5GB")
            made[name] = (path, hf)
        return made[name]

    return get


class Runner:
    """tokenmill's model plus the toy block allocator: feeds chunks, returns float32 logits."""

    def __init__(self, path, block_size=16):
        config = AutoConfig.from_pretrained(path)
        build = ModelBuildContext(dtype=torch.float32, block_size=block_size,
                                  attention_backend=ReferenceAttentionBackend)
        self.model = build_model(config, build)
        load_weights(self.model, str(path))
        self.backend = ReferenceAttentionBackend()
        self.harness = PagedHarness(block_size=block_size, num_blocks=48, seed=1)
        self.caches = self.harness.allocate_caches(self.backend, self.model.attention_specs())

    def step(self, chunks):
        """Logits of every fed token, split per chunk."""
        step = self.harness.step(chunks)
        ctx = self.harness.context(self.backend, self.caches, step)
        with torch.inference_mode():
            logits = self.model.compute_logits(self.model(step.input_ids, step.positions, ctx))
        assert logits.dtype == torch.float32
        return list(logits.split([len(tokens) for _, tokens in chunks]))


def hf_step(hf, tokens, cache):
    """HF forward of ``tokens`` after what ``cache`` holds; the cache argument's name changed in
    transformers 5 (``cache``), older versions call it ``past_key_values``."""
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        return hf(input_ids=torch.tensor([tokens]), use_cache=True, **{name: cache})


def hf_logits(hf, tokens):
    with torch.inference_mode():
        return hf(input_ids=torch.tensor([tokens])).logits[0].float()


def prompts(vocab, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_batch_matches_hf(checkpoints, name):
    path, hf = checkpoints(name)
    if name in SHARDED:
        assert (path / "model.safetensors.index.json").is_file()
    runner = Runner(path)
    seqs = prompts(hf.config.vocab_size, [13, 5, 29])
    got = runner.step(list(enumerate(seqs)))
    for tokens, logits in zip(seqs, got, strict=True):
        want = hf_logits(hf, tokens)
        assert want.abs().max() > 0.5  # weights large enough for the comparison to mean something
        torch.testing.assert_close(logits, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_decode_matches_hf_kv_cache(checkpoints, name):
    path, hf = checkpoints(name)
    runner = Runner(path)
    seqs = prompts(hf.config.vocab_size, [9, 17, 4], seed=1)
    got = runner.step(list(enumerate(seqs)))
    caches, next_tokens = [], []
    for tokens, logits in zip(seqs, got, strict=True):
        out = hf_step(hf, tokens, DynamicCache(config=hf.config))
        torch.testing.assert_close(logits[-1], out.logits[0, -1].float(), atol=ATOL, rtol=0)
        caches.append(out.past_key_values)
        next_tokens.append(int(logits[-1].argmax()))
    for _ in range(16):
        got = runner.step([(i, [t]) for i, t in enumerate(next_tokens)])
        for i, logits in enumerate(got):
            out = hf_step(hf, [next_tokens[i]], caches[i])
            torch.testing.assert_close(logits[0], out.logits[0, -1].float(), atol=ATOL, rtol=0)
            caches[i] = out.past_key_values
            next_tokens[i] = int(logits[0].argmax())


@pytest.mark.parametrize("name", ["llama", "mistral-sliding-window", "qwen2-sharded-sliding-upper-layers", "qwen3"])
def test_mixed_steps_chunked_prefill_and_shared_prefix(checkpoints, name):
    """Prefill chunks with cached context (context_lens > 0), decodes and a new prefill in one
    step, and a sequence whose first block comes from another's cache."""
    path, hf = checkpoints(name)
    runner = Runner(path)
    a, b, c = prompts(hf.config.vocab_size, [12, 30, 7], seed=2)
    d = b[:16] + prompts(hf.config.vocab_size, [9], seed=3)[0]
    full = {"a": list(a), "b": list(b), "c": list(c), "d": d}

    def check(chunks, got, fed):
        for (seq, tokens), logits in zip(chunks, got, strict=True):
            start = fed[seq]
            fed[seq] += len(tokens)
            want = hf_logits(hf, full[seq][: fed[seq]])[start:]
            torch.testing.assert_close(logits, want, atol=ATOL, rtol=0, msg=lambda m, s=seq: f"{s}: {m}")

    fed = {"a": 0, "b": 0, "c": 0, "d": 0}
    steps = [
        [("a", a), ("b", b[:10])],
        [("b", b[10:25]), ("a", [5]), ("c", c)],
        [("c", [11]), ("b", b[25:]), ("a", [3])],
        [("d", d[16:]), ("c", [7])],
    ]
    for index, chunks in enumerate(steps):
        if index == 3:
            runner.harness.share_prefix("d", "b", 16)
            fed["d"] = 16
        for seq, tokens in chunks:
            if fed[seq] + len(tokens) > len(full[seq]):
                full[seq].extend(tokens)
        check(chunks, runner.step(chunks), fed)


def test_attention_specs_follow_the_config(checkpoints):
    qwen2 = Runner(checkpoints("qwen2-sharded-sliding-upper-layers")[0]).model
    assert [s.sliding_window for s in qwen2.attention_specs()] == [None, 7, 7]
    mistral = Runner(checkpoints("mistral-sliding-window")[0]).model
    assert [s.sliding_window for s in mistral.attention_specs()] == [6, 6]
    llama = Runner(checkpoints("llama-head-dim-biases")[0]).model
    spec = llama.attention_specs()[0]
    assert (spec.num_heads, spec.num_kv_heads, spec.head_size, spec.scale) == (4, 2, 24, 24**-0.5)
    tied = Runner(checkpoints("llama-llama3-rope-tied")[0]).model
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
