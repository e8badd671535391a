"""Shared checks of tokenmill models against Hugging Face transformers: tiny random-weight models
saved as safetensors, loaded by tokenmill's loader, run through the reference paged attention on
flat mixed batches (prefill of several sequences, then decode steps), logits compared with HF's
forward and its own KV cache. Tests import it by file path (they run with --import-mode=importlib)."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, LlamaConfig

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.paged_harness import PagedHarness

ATOL = 1e-4





def save_tiny(config, path: Path, seed: int = 0):
    """A random-weight HF model for ``config`` (eager attention), saved to ``path``; returns it."""
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    hf.save_pretrained(path, safe_serialization=True)
    return hf


class Runner:
    """tokenmill's model plus the toy block allocator: feeds chunks, returns float32 logits."""

    def __init__(self, path, block_size: int = 16, num_blocks: int = 48):
        config = AutoConfig.from_pretrained(path)
        build = ModelBuildContext(dtype=torch.float32, block_size=block_size,
                                  attention_backend=ReferenceAttentionBackend)
        self.model = build_model(config, build)
        load_weights(self.model, str(path))
        self.backend = ReferenceAttentionBackend()
        self.harness = PagedHarness(block_size=block_size, num_blocks=num_blocks, seed=1)
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
    """HF forward of ``tokens`` after what ``cache`` holds (the argument is ``cache`` in transformers 5)."""
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        return hf(input_ids=torch.tensor([tokens]), use_cache=True, **{name: cache})


def hf_logits(hf, tokens):
    with torch.inference_mode():
        return hf(input_ids=torch.tensor([tokens])).logits[0].float()


def prompts(vocab, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def check_prefill(path, hf, lengths=(13, 5, 29)):
    """One flat batch of several prompts: every token's logits match HF's."""
    runner = Runner(path)
    seqs = prompts(hf.config.vocab_size, lengths)
    got = runner.step(list(enumerate(seqs)))
    for tokens, logits in zip(seqs, got, strict=True):
        want = hf_logits(hf, tokens)
        assert want.abs().max() > 0.5  # weights large enough for the comparison to mean something
        torch.testing.assert_close(logits, want, atol=ATOL, rtol=0)
    return runner


def check_decode(path, hf, lengths=(9, 17, 4), steps: int = 16):
    """Prefill then ``steps`` batched greedy decode steps: logits match HF with its KV cache."""
    runner = Runner(path)
    seqs = prompts(hf.config.vocab_size, lengths, seed=1)
    got = runner.step(list(enumerate(seqs)))
    caches, next_tokens = [], []
    for tokens, logits in zip(seqs, got, strict=True):
        out = hf_step(hf, tokens, DynamicCache(config=hf.config))
        torch.testing.assert_close(logits[-1], out.logits[0, -1].float(), atol=ATOL, rtol=0)
        caches.append(out.past_key_values)
        next_tokens.append(int(logits[-1].argmax()))
    for _ in range(steps):
        got = runner.step([(i, [t]) for i, t in enumerate(next_tokens)])
        for i, logits in enumerate(got):
            out = hf_step(hf, [next_tokens[i]], caches[i])
            torch.testing.assert_close(logits[0], out.logits[0, -1].float(), atol=ATOL, rtol=0)
            caches[i] = out.past_key_values
            next_tokens[i] = int(logits[0].argmax())
    return runner


def save_llama(path, seed: int, **changes) -> str:
    """A tiny random Llama (2 layers, vocabulary 160, GQA) with a word tokenizer, saved to ``path`` so
    LLM can load it; ``changes`` override config fields. Returns the path as a string."""
    torch.manual_seed(seed)
    settings = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=2, max_position_embeddings=256)
    settings.update(changes)
    AutoModelForCausalLM.from_config(LlamaConfig(**settings)).save_pretrained(path)
    save_word_tokenizer(path, settings["vocab_size"])
    return str(path)


def save_word_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer over "w0" ... "w{vocab_size - 1}" so LLM can load a tiny model directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w1").save_pretrained(path)


def save_bracketed_llama(path: Path, vocab_size: int = 160) -> str:
    """``save_llama`` (seed 3) with a word tokenizer over "<0>" ... "<vocab_size - 1>": no token is a prefix
    of another, so grammars over these words never reach a dead end. Returns the path as a string."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    save_llama(path, seed=3, vocab_size=vocab_size)
    tokenizer = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token="<1>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<1>").save_pretrained(path)
    return str(path)
