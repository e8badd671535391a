"""Tool-call parsers: a model family's own tool-call syntax in its output text -> the answer's content and
its tool calls (vLLM's ``--tool-call-parser`` names), for ``tool_choice: "auto"``.

- ``hermes`` (Hermes, Qwen 2.5/3, SmolLM3 and others): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks after optional text.
- ``llama3_json`` (Llama 3.1-3.3): the whole answer is ``{"name": ..., "parameters": {...}}`` (optionally
  after ``<|python_tag|>``), several calls separated by ``;``.
- ``mistral``: after optional text, ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (tokenizers
  before v11: Mistral 7B v0.3, Nemo) or ``[TOOL_CALLS]name[ARGS]{...}`` once per call (v11 on: Mistral
  Small 3.1+, Devstral, Magistral; v13 puts ``[CALL_ID]id`` before ``[ARGS]``). The markers are special
  tokens, so the server keeps special tokens in such answers; a whole answer that is a JSON list of
  calls reads as calls even without the marker.
- ``pythonic`` (Llama 3.2 / 4 and others prompted that way): the whole answer is a Python list of calls,
  ``[get_weather(city="Paris"), ping()]`` with literal keyword arguments (read by ``ast``, never run).

An output that does not parse as calls is plain content: nothing is lost.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field


@dataclass
class ParsedOutput:
    """The answer's text (None when there is none besides the calls) and its calls as (name, arguments JSON)."""

    content: str | None
    calls: list[tuple[str, str]] = field(default_factory=list)


def _call(obj: object, arguments_key: str) -> tuple[str, str] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def _held_back(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _may_open_calls(text: str, opener: str, tag: str | None = None) -> bool:
    """Whether a streamed answer that is calls only when it is calls as a whole may still turn out to be
    calls: nothing but whitespace yet, it opens with ``opener``, or it opens with (a start of) ``tag``."""
    head = text.lstrip()
    return not head or head.startswith(opener) or (tag is not None and (head.startswith(tag) or tag.startswith(head)))


class HermesParser:
    """``<tool_call>{json}</tool_call>`` blocks."""

    name = "hermes"
    keeps_special_tokens = False
    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def parse(self, text: str) -> ParsedOutput:
        """Content before the first block, and one call per block (all or nothing)."""
        start = text.find(self.START)
        if start < 0:
            return ParsedOutput(text)
        calls = []
        for body in self._BLOCK.findall(text[start:]):
            try:
                call = _call(json.loads(body), "arguments")
            except ValueError:
                call = None
            if call is None:
                return ParsedOutput(text)
            calls.append(call)
        return ParsedOutput(text[:start].strip() or None, calls)

    def content_end(self, text: str) -> int:
        """How much of a streamed ``text`` is surely content (the rest may open a tool call)."""
        start = text.find(self.START)
        return start if start >= 0 else len(text) - _held_back(text, self.START)


class Llama3JsonParser:
    """A whole answer of ``{"name", "parameters"}`` objects separated by ``;``."""

    name = "llama3_json"
    keeps_special_tokens = False
    TAG = "<|python_tag|>"

    def parse(self, text: str) -> ParsedOutput:
        """Calls when the whole answer is calls, else the answer as content."""
        body = text.strip()
        body = body[len(self.TAG):].lstrip() if body.startswith(self.TAG) else body
        if not body.startswith("{"):
            return ParsedOutput(text)
        decoder, calls, position = json.JSONDecoder(), [], 0
        while position < len(body):
            try:
                obj, position = decoder.raw_decode(body, position)
            except ValueError:
                return ParsedOutput(text)
            call = _call(obj, "parameters")
            if call is None:
                return ParsedOutput(text)
            calls.append(call)
            while position < len(body) and body[position] in " \t\r\n;":
                position += 1
        return ParsedOutput(None, calls)

    def content_end(self, text: str) -> int:
        """0 while the answer may still turn out to be calls (it starts with ``{`` or the tag), else all."""
        return 0 if _may_open_calls(text, "{", self.TAG) else len(text)


class MistralParser:
    """``[TOOL_CALLS]`` and a JSON list of ``{"name", "arguments"}`` objects, or ``[TOOL_CALLS]name[ARGS]{...}``
    once per call."""

    name = "mistral"
    keeps_special_tokens = True
    MARKER = "[TOOL_CALLS]"
    _NAMED_CALL = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9]+\s*)?(?:\[ARGS\])?\s*(?=\{)")

    def parse(self, text: str) -> ParsedOutput:
        """Content before the first marker and the calls after it; without the marker, calls only when the
        whole answer is a JSON list of calls."""
        start = text.find(self.MARKER)
        if start < 0:
            calls = self._listed_calls(text.strip())
            return ParsedOutput(None, calls) if calls is not None else ParsedOutput(text)
        pieces = text[start + len(self.MARKER):].split(self.MARKER)
        if len(pieces) == 1 and pieces[0].lstrip()[:1] in ("[", "{"):
            calls = self._listed_calls(pieces[0].strip())
        else:
            named = [self._named_call(piece) for piece in pieces]
            calls = None if any(call is None for call in named) else named
        if calls is None:
            return ParsedOutput(text)
        return ParsedOutput(text[:start].strip() or None, calls)

    @staticmethod
    def _listed_calls(body: str) -> list[tuple[str, str]] | None:
        try:
            found = json.loads(body)
        except ValueError:
            return None
        found = [found] if isinstance(found, dict) else found
        if not isinstance(found, list) or not found:
            return None
        calls = [_call(obj, "arguments") for obj in found]
        return None if any(call is None for call in calls) else calls

    @classmethod
    def _named_call(cls, piece: str) -> tuple[str, str] | None:
        """``name[ARGS]{...}`` (the ``[ARGS]`` may be missing, a ``[CALL_ID]id`` may precede it) as a call."""
        head = cls._NAMED_CALL.match(piece)
        if head is None:
            return None
        try:
            arguments, end = json.JSONDecoder().raw_decode(piece, head.end())
        except ValueError:
            return None
        if piece[end:].strip():
            return None
        return _call({"name": head.group(1), "arguments": arguments}, "arguments")

    def content_end(self, text: str) -> int:
        """Up to the marker; 0 while a marker-less answer may still be a list of calls."""
        start = text.find(self.MARKER)
        if start >= 0:
            return start
        return 0 if _may_open_calls(text, "[") else len(text) - _held_back(text, self.MARKER)


class PythonicParser:
    """A whole answer ``[f(a=1), g()]``: calls with literal keyword arguments, parsed, never evaluated."""

    name = "pythonic"
    keeps_special_tokens = False
    TAGS = ("<|python_start|>", "<|python_end|>")

    def parse(self, text: str) -> ParsedOutput:
        """Calls when the whole answer is a list of calls, else the answer as content."""
        body = text.strip()
        start, end = self.TAGS
        body = body[len(start):] if body.startswith(start) else body
        body = (body[:-len(end)] if body.endswith(end) else body).strip()
        if not body.startswith("["):
            return ParsedOutput(text)
        try:
            tree = ast.parse(body, mode="eval").body
            calls = [self._call(node) for node in tree.elts] if isinstance(tree, ast.List) and tree.elts else None
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            calls = None
        return ParsedOutput(None, calls) if calls else ParsedOutput(text)

    @staticmethod
    def _call(node: ast.expr) -> tuple[str, str]:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            raise ValueError("not a call of a plain name with keyword arguments")
        if any(keyword.arg is None for keyword in node.keywords):  # **kwargs
            raise ValueError("keyword arguments must be named")
        arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords}
        return node.func.id, json.dumps(arguments, ensure_ascii=False, allow_nan=False)

    def content_end(self, text: str) -> int:
        """0 while the answer may still be a list of calls (it starts with ``[`` or the tag), else all."""
        return 0 if _may_open_calls(text, "[", self.TAGS[0]) else len(text)


ToolCallParser = HermesParser | Llama3JsonParser | MistralParser | PythonicParser
PARSERS = {parser.name: parser for parser in (HermesParser, Llama3JsonParser, MistralParser, PythonicParser)}


def tool_call_parser(name: str) -> ToolCallParser:
    """The parser called ``name``; ValueError naming the choices for another."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}: choose one of {', '.join(sorted(PARSERS))}")
    return PARSERS[name]()
