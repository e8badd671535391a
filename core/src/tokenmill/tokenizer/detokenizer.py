"""IncrementalDetokenizer: token ids in, text deltas out, equal in sum to the tokenizer's decode."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

# prompt tokens decoded as left context for the first output tokens (their leading space, merges);
# the context grows up to the maximum while it would start inside a multi-byte character
_PROMPT_CONTEXT = 5
_MAX_PROMPT_CONTEXT = 24
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a stream of token ids into text deltas without ever emitting broken UTF-8.

    The offsets method of HF TGI and vLLM: decode a short window that ends at the newest token and
    emit what it adds to the text of the window's older part; while the window's text ends in U+FFFD
    (an incomplete UTF-8 sequence, or a byte token still waiting for its continuation) the text is
    held back. ``flush`` at the end emits whatever is held.

    With a fast (Rust) tokenizer the concatenated deltas equal ``tokenizer.decode(ids,
    skip_special_tokens=...)`` of the output alone, or, after a prompt, the text the output adds to
    the decoded prompt. HF ignores ``spaces_between_special_tokens`` for fast tokenizers, and so does
    this class; for slow (Python) tokenizers it is passed on to their ``decode``. The WordPiece
    ``clean_up_tokenization_spaces`` pass is not applied (it cannot be applied incrementally).

    Exactness needs decode to be stable under appending, which holds for byte-level BPE (even on
    invalid UTF-8) and for byte-fallback (Llama-style) tokenizers on valid UTF-8. A byte-fallback
    decoder turns a whole run of byte tokens into U+FFFDs once the run is invalid; a stream cannot
    foresee that, so there it emits the characters that were valid when they arrived.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._decode = _window_decoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self._window = self._prompt_context(list(prompt_token_ids))
        self._read_offset = len(self._window)  # window[:read_offset] has been emitted (or is prompt)
        self._read_text = self._decode(self._window)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (possibly "")."""
        self._window.append(int(token_id))
        text = self._decode(self._window)
        if len(text) > len(self._read_text) and not text.endswith(_REPLACEMENT_CHAR):
            return self._advance(text)
        return ""

    def push_many(self, token_ids: Iterable[int]) -> str:
        """Add several tokens; return the text they complete."""
        return "".join(self.push(t) for t in token_ids)

    def flush(self) -> str:
        """Emit everything still held back (at the end of the sequence), even a trailing U+FFFD."""
        text = self._decode(self._window)
        return self._advance(text) if len(text) > len(self._read_text) else ""

    def _prompt_context(self, prompt_token_ids: list[int]) -> list[int]:
        size = min(_PROMPT_CONTEXT, len(prompt_token_ids))
        while size < min(_MAX_PROMPT_CONTEXT, len(prompt_token_ids)):
            if _REPLACEMENT_CHAR not in self._decode(prompt_token_ids[-size:]):
                break
            size += 1
        return [int(t) for t in prompt_token_ids[len(prompt_token_ids) - size :]]

    def _advance(self, text: str) -> str:
        delta = text[len(self._read_text) :]
        # the next window starts where this one's emitted part ended
        self._window = self._window[self._read_offset :]
        self._read_offset = len(self._window)
        self._read_text = self._decode(self._window)
        return delta


def token_texts(tokenizer: Any, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (special tokens kept), as shown next to logprobs."""
    backend = _fast_backend(tokenizer)
    if backend is not None:
        return backend.decode_batch([[t] for t in token_ids], skip_special_tokens=False)
    return [tokenizer.decode([t]) for t in token_ids]


def _window_decoder(
    tokenizer: Any, skip_special_tokens: bool, spaces_between_special_tokens: bool
) -> Callable[[list[int]], str]:
    backend = _fast_backend(tokenizer)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(
        ids,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=spaces_between_special_tokens,
        clean_up_tokenization_spaces=False,
    )


def _fast_backend(tokenizer: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` behind an HF fast tokenizer (or the object itself), else None."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None
