"""Tokenizer helpers: loading, chat templates, bad words, incremental detokenizing, stop strings."""

from tokenmill.tokenizer.bad_words import bad_words_token_ids
from tokenmill.tokenizer.chat_template import ChatTemplateError, apply_chat_template, chat_prompt_token_ids
from tokenmill.tokenizer.detokenizer import IncrementalDetokenizer, token_texts
from tokenmill.tokenizer.loader import TokenizerLoadError, load_tokenizer
from tokenmill.tokenizer.stop_strings import find_stop_string, stop_holdback

__all__ = [
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "TokenizerLoadError",
    "apply_chat_template",
    "bad_words_token_ids",
    "chat_prompt_token_ids",
    "find_stop_string",
    "load_tokenizer",
    "stop_holdback",
    "token_texts",
]
