"""PromptBounds: how much request text the server tokenizes, whatever the request holds.

Tokenizing costs time and memory in proportion to the text, not to what the model can take, so a
prompt far beyond the context must be refused before the tokenizer sees it. Two bounds, in order:

- characters: a text longer than ``CHARS_PER_TOKEN`` characters for each token of the context
  (``max_model_len + 1`` tokens) is refused with a 400 at once, never tokenized;
- tokens: the ids of a text within that bound are cut at ``max_model_len + 1``, one more than any
  prompt may have, so the context-length check still refuses it; the error gives the true count.

Encoding runs on the engine's tokenizer pool (``AsyncLLM.run_tokenizer``), off the event loop.
A chat conversation is measured before its template renders it: the characters of every string the
template receives (contents, tool calls, tools, template variables) plus ``TEMPLATE_CHARS_PER_MESSAGE``
for each message's own markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenmill_server.errors import ApiError, context_length_exceeded
from tokenmill_server.generation import check_text

# Characters one token may stand for, generously: real text averages 3 to 5 and the longest entries
# of common vocabularies (runs of spaces or of one symbol) stay near this; only text made mostly of
# such runs, longer than 32 characters a token on average, is refused before it is tokenized.
CHARS_PER_TOKEN = 32
TEMPLATE_CHARS_PER_MESSAGE = 32  # a chat template's markup around each message (role tags, separators)


@dataclass(frozen=True)
class PromptBounds:
    """The character and token bounds of one model's prompts (``max_model_len`` tokens of context)."""

    max_model_len: int

    @property
    def max_tokens(self) -> int:
        """Where encoded ids are cut: one token more than any prompt may have."""
        return self.max_model_len + 1

    @property
    def max_chars(self) -> int:
        """The longest text that is tokenized at all."""
        return self.max_tokens * CHARS_PER_TOKEN

    def check_chars(self, num_chars: int, param: str, what: str = "prompt") -> None:
        """400 (context_length_exceeded) when ``num_chars`` characters cannot fit the context."""
        if num_chars > self.max_chars:
            raise ApiError(400, f"The {what} is {num_chars} characters long, more than this model's maximum context "
                                f"length of {self.max_model_len} tokens can hold (at most {self.max_chars} characters "
                                f"are tokenized). Please reduce the length of the input.",
                           param=param, code="context_length_exceeded")

    def check_text(self, text: str, param: str, what: str = "prompt") -> str:
        """``text``, or a 400 when it is longer than ``max_chars`` characters."""
        self.check_chars(len(text), param, what)
        return text


    def check_conversation(self, conversation: Sequence[Mapping[str, Any]], template_inputs: Any = None,
                           param: str = "messages") -> None:
        """400 when a conversation and what its template also renders (``template_inputs``: tools,
        documents, template variables) add up to more characters than ``max_chars``."""
        size = text_size(conversation) + text_size(template_inputs) + TEMPLATE_CHARS_PER_MESSAGE * len(conversation)
        self.check_chars(size, param, "conversation")

    async def encode(self, engine: Any, text: str, param: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (a 400 beyond ``max_chars``, or for invalid Unicode) from the tokenizer pool, at
        most ``max_tokens`` of them; a text of more tokens is refused here with its true count."""
        check_text(self.check_text(text, param), param)
        ids, count = await engine.run_tokenizer(encode_cut, engine.tokenizer, text, add_special_tokens,
                                                self.max_tokens)
        if count > len(ids):
            raise context_length_exceeded(self.max_model_len, count, None)
        return ids

    async def encode_end(self, engine: Any, text: str, param: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of the last ``max_chars`` characters of ``text``, for a request that keeps only its prompt's
        last tokens (``truncate_prompt_tokens``): that end holds more tokens than any prompt may keep."""
        end = text[-self.max_chars:] if len(text) > self.max_chars else text
        check_text(end, param)
        ids, _ = await engine.run_tokenizer(encode_cut, engine.tokenizer, end, add_special_tokens, None)
        return ids


def encode_cut(tokenizer: Any, text: str, add_special_tokens: bool, limit: int | None) -> tuple[list[int], int]:
    """The first ``limit`` ids of ``text`` (all for None) and how many there were in all. The cut is made after
    encoding: a tokenizer's own truncation setting is shared state, unsafe while other threads encode."""
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return list(ids[:limit]), len(ids)


def text_size(value: Any) -> int:
    """The characters of every string in a JSON-like value (keys included), without recursion."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif hasattr(item, "model_dump"):  # a pydantic model (a tool call, a tool)
            pending.append(item.model_dump())
    return total
