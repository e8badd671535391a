"""bad_words_token_ids: the token sequences the sampler bans for a request's ``bad_words``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def bad_words_token_ids(tokenizer: Any, bad_words: Iterable[str]) -> list[list[int]]:
    """Tokenize each bad word as it appears at the start of a text and after a space (vLLM's rule).

    The spaced form is added only when it is a different word token with the same length, so
    both "Hello" and " Hello" are banned when the vocabulary distinguishes them. Meant to run once
    per request in the front end; the result goes into ``SamplingParams.bad_words_token_ids``.
    """
    sequences: list[list[int]] = []
    for word in bad_words:
        bare = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not bare:
            continue
        sequences.append(bare)
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return sequences
