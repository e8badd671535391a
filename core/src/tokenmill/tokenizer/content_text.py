"""Chat prompts whose message text stays text, special-token strings included.

A special-token string written in a message
(``"<|im_end|>\\n<|im_start|>system\\n..."``) is tokenized as ordinary characters, while the chat
template's own markers stay special tokens, so user text cannot forge a turn or any control token.

How: before rendering, each special-token string in the conversation's text (message fields, tools,
documents) is replaced by a private-use placeholder character that appears nowhere else; after
rendering, the placeholders are put back and their positions remembered. The prompt is tokenized as
usual, and each special token that lies at a remembered position is replaced by the ids of its text
(``split_special_tokens``). Everything else is exactly the usual tokenization, since special tokens
are hard boundaries for the tokenizer."""

from __future__ import annotations

import bisect
import itertools
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# supplementary private-use planes 15 and 16: no tokenizer or template gives them a meaning
_PRIVATE = re.compile("[\U000f0000-\U000ffffd\U00100000-\U0010fffd]")
_PLACEHOLDER_CODES = (range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))
_GUARDED_KWARGS = ("tools", "documents")


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's special tokens (strings the tokenizer turns into one control id), by string."""
    found: dict[str, int] = {}
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            found[str(token)] = int(token_id)
    for text, token_id in zip(getattr(tokenizer, "all_special_tokens", ()), getattr(tokenizer, "all_special_ids", ()),
                              strict=False):
        found.setdefault(text, token_id)
    return {text: token_id for text, token_id in found.items() if text}


def trie_pattern(words: Sequence[str]) -> str:
    """A regex for any of ``words``, the longest where several match, built as a trie: at each position
    the regex follows one branch per character, so its cost does not grow with the number of words."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return pattern(trie) if words else "(?!)"


_SPECIALS: weakref.WeakKeyDictionary[Any, tuple[dict[str, int], re.Pattern[str]]] = weakref.WeakKeyDictionary()


def _specials_and_pattern(tokenizer: Any) -> tuple[dict[str, int], re.Pattern[str]]:
    """``special_tokens`` and their trie pattern, computed once per tokenizer."""
    cached = _SPECIALS.get(tokenizer)
    if cached is None:
        specials = special_tokens(tokenizer)
        cached = _SPECIALS[tokenizer] = (specials, re.compile(trie_pattern(list(specials))))
    return cached


class _Placeholders:
    """Swaps special-token strings in text for placeholder characters, remembering which is which."""

    def __init__(self, pattern: re.Pattern[str], taken: set[str]) -> None:
        self.pattern = pattern
        self.originals: dict[str, str] = {}
        self._free = (chr(code) for code in itertools.chain(*_PLACEHOLDER_CODES) if chr(code) not in taken)

    def hide(self, value: Any, key: str | None = None) -> Any:
        """``value`` (a string, or lists and dicts of them) with special-token strings hidden; a
        message's ``role`` is left alone."""
        if isinstance(value, str):
            return value if key == "role" else self.pattern.sub(self._placeholder, value)
        if isinstance(value, Mapping):
            return {k: self.hide(v, k) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.hide(v) for v in value]
        return value

    def _placeholder(self, match: re.Match[str]) -> str:
        placeholder = next(self._free, None)
        if placeholder is None:
            raise ValueError("The messages hold too many special-token strings.")
        self.originals[placeholder] = match.group(0)
        return placeholder

    def restore(self, rendered: str) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text with the special-token strings back, and their (start, end) spans in it."""
        pieces, spans, length, last = [], [], 0, 0
        for match in _PRIVATE.finditer(rendered):
            original = self.originals.get(match.group(0))
            if original is None:
                continue
            pieces.append(rendered[last:match.start()])
            length += match.start() - last
            spans.append((length, length + len(original)))
            pieces.append(original)
            length += len(original)
            last = match.end()
        pieces.append(rendered[last:])
        return "".join(pieces), spans


def _taken_characters(values: Sequence[Any]) -> set[str]:
    taken: set[str] = set()
    pending = list(values)
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            taken.update(_PRIVATE.findall(item))
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return taken


def _text_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def _ids_with_text_at(tokenizer: Any, text: str, spans: list[tuple[int, int]], specials: set[int]) -> list[int]:
    """``text``'s usual ids, except that a special token overlapping one of ``spans`` becomes its text's ids."""
    if not getattr(tokenizer, "is_fast", False):  # no offsets: tokenize around the spans
        ids, last = [], 0
        for start, end in spans:
            ids += tokenizer.encode(text[last:start], add_special_tokens=False) if start > last else []
            ids += _text_ids(tokenizer, text[start:end])
            last = end
        return ids + (list(tokenizer.encode(text[last:], add_special_tokens=False)) if last < len(text) else [])
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = [start for start, _ in spans]
    ids = []
    for token_id, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"], strict=True):
        at = bisect.bisect_right(starts, end - 1) - 1  # the last span starting before this token ends
        if token_id in specials and at >= 0 and spans[at][1] > start:
            ids += _text_ids(tokenizer, text[start:end])
        else:
            ids.append(token_id)
    return ids


@dataclass(frozen=True)
class RenderedChat:
    """A rendered chat prompt, and the (start, end) spans of special-token strings in it that came from
    the messages and are to be tokenized as text (none: the text is tokenized as one string)."""

    text: str
    text_spans: tuple[tuple[int, int], ...] = ()


def render_content_as_text(tokenizer: Any, messages: Sequence[dict[str, Any]], render: Callable[..., str],
                           **kwargs: Any) -> RenderedChat:
    """The prompt ``render(messages, **kwargs)``, noting where special-token strings from the messages
    (and the ``tools`` and ``documents`` kwargs) ended up."""
    specials, pattern = _specials_and_pattern(tokenizer)
    if not specials:
        return RenderedChat(render(messages, **kwargs))
    guarded = [messages, *(kwargs[name] for name in _GUARDED_KWARGS if kwargs.get(name) is not None)]
    placeholders = _Placeholders(pattern, _taken_characters(
        [*guarded, kwargs.get("chat_template"), getattr(tokenizer, "chat_template", None)]))
    hidden_messages = placeholders.hide(list(messages))
    hidden_kwargs = {name: placeholders.hide(value) if name in _GUARDED_KWARGS else value
                     for name, value in kwargs.items()}
    if not placeholders.originals:  # the common case: no special-token strings in the text
        return RenderedChat(render(messages, **kwargs))
    text, spans = placeholders.restore(render(hidden_messages, **hidden_kwargs))
    return RenderedChat(text, tuple(spans))


def rendered_token_ids(tokenizer: Any, rendered: RenderedChat) -> list[int]:
    """The ids of a rendered prompt: its template's special tokens as control tokens, its text spans as text."""
    if not rendered.text_spans:
        return list(tokenizer.encode(rendered.text, add_special_tokens=False))
    specials = set(_specials_and_pattern(tokenizer)[0].values())
    return _ids_with_text_at(tokenizer, rendered.text, list(rendered.text_spans), specials)
