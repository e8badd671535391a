"""The tokenizer a GGUF carries is converted once per file and then loaded from the cache: the
cached one encodes, decodes and renders the chat template exactly as the freshly converted one."""

from __future__ import annotations

import os
import shutil

from tokenmill_quant_gguf import gguf_tokenizer
from tokenmill_quant_gguf.gguf_tokenizer import cache_key, load_gguf_tokenizer, tokenizer_cache_dir
from tokenmill_quant_gguf.quantizer import GGUFQuantizer

TEXTS = ["Hello there! Write x² in café style.", "def f(n):\n    return n * 2\n", "日本語のテキスト 123"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


def _same(first, second) -> None:
    for text in TEXTS:
        ids = first(text)["input_ids"]
        assert second(text)["input_ids"] == ids
        assert second.decode(ids) == first.decode(ids)
    render = dict(tokenize=False, add_generation_prompt=True)
    assert second.apply_chat_template(MESSAGES, **render) == first.apply_chat_template(MESSAGES, **render)
    assert (second.bos_token, second.eos_token, len(second)) == (first.bos_token, first.eos_token, len(first))


def test_converted_once_then_loaded_from_the_cache(smollm2_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path))
    converted = load_gguf_tokenizer(smollm2_gguf)
    entry = tokenizer_cache_dir() / cache_key(smollm2_gguf)
    assert (entry / "tokenizer.json").is_file() and (entry / "chat_template.jinja").is_file()
    assert not [p for p in tokenizer_cache_dir().iterdir() if p.name.startswith(".")]

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again although cached")

    import transformers

    original = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda location, **kwargs: no_conversion() if "gguf_file" in kwargs else original(location, **kwargs))
    _same(converted, load_gguf_tokenizer(smollm2_gguf))
    _same(converted, GGUFQuantizer.from_config({}, smollm2_gguf).tokenizer(smollm2_gguf))  # what core asks


def test_a_changed_file_gets_a_new_entry(smollm2_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path))
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_gguf, copy)
    before = cache_key(copy)
    os.utime(copy, ns=(1, 1))
    assert cache_key(copy) != before


def test_an_unwritable_cache_still_returns_the_tokenizer(smollm2_gguf, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TOKENMILL_CACHE", str(blocker))  # "tokenizers" cannot be created under a file
    tokenizer = load_gguf_tokenizer(smollm2_gguf)
    assert tokenizer("hi")["input_ids"]


def test_only_the_most_recent_entries_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path))
    root = tokenizer_cache_dir()
    root.mkdir(parents=True)
    for index in range(gguf_tokenizer.KEEP + 3):
        (root / f"old-{index}").mkdir()
        os.utime(root / f"old-{index}", ns=(index, index))

    class Saver:
        def save_pretrained(self, folder: str) -> None:
            with open(os.path.join(folder, "tokenizer.json"), "w") as f:
                f.write("{}")

    gguf_tokenizer._store(Saver(), root / "new")
    kept = {p.name for p in root.iterdir()}
    assert "new" in kept and len(kept) == gguf_tokenizer.KEEP
    assert "old-0" not in kept and f"old-{gguf_tokenizer.KEEP + 2}" in kept
