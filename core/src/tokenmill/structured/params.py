"""StructuredOutputsParams: the constraint one request's output must satisfy (vLLM's field names)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tokenmill.structured.empty_schemas import unsatisfiable_reason

MAX_CHOICES = 1024
# bounds that keep a constraint's checking and compiling short: xgrammar's work grows with the text's
# length and a JSON schema's nesting, so both are capped before anything is compiled
MAX_CONSTRAINT_CHARS = 256 * 1024
MAX_JSON_DEPTH = 64
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """Exactly one of ``json`` (a JSON schema, as a dict or its text), ``regex``, ``choice`` (the output is
    one of these strings), ``grammar`` (EBNF, xgrammar's dialect of GBNF), ``json_object`` (any JSON
    object) or ``structural_tag`` (xgrammar's structural tag as JSON text: free text in which each
    tag's begin marker starts content of its schema, in the ``{"type": "structural_tag", "format": ...}``
    form or the older ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``) must be set. ``disable_any_whitespace``: JSON without optional whitespace (a small model
    may otherwise fill its tokens with it). Validated on construction; the grammar itself is checked by
    ``check_grammar``."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        chosen = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(chosen) != 1:
            named = ", ".join(chosen) if chosen else "none"
            raise ValueError(f"structured outputs take exactly one of {', '.join(KINDS)} (got {named}).")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError("structured outputs: json must be a JSON schema (an object or its text).")
        if self.choice is not None:
            if not isinstance(self.choice, list) or not self.choice or not all(isinstance(c, str) for c in self.choice):
                raise ValueError("structured outputs: choice must be a non-empty list of strings.")
            if len(self.choice) > MAX_CHOICES:
                raise ValueError(f"structured outputs: at most {MAX_CHOICES} choices (got {len(self.choice)}).")
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured outputs: {name} must be a non-empty string.")
        text = self.key()[1]
        if len(text) > MAX_CONSTRAINT_CHARS:
            raise ValueError(f"structured outputs: the {self.kind} is {len(text)} characters long, more than "
                             f"the {MAX_CONSTRAINT_CHARS} allowed.")
        written = self.json if isinstance(self.json, str) else self.structural_tag
        if written is not None:
            try:
                parsed = json.loads(written)
            except ValueError as error:
                raise ValueError(f"structured outputs: {self.kind} is not valid JSON: {error}") from None
        else:
            parsed = self.json
        if parsed is not None and _depth(parsed) > MAX_JSON_DEPTH:
            raise ValueError(f"structured outputs: the JSON schema nests deeper than {MAX_JSON_DEPTH} levels.")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    def key(self) -> tuple[str, str]:
        """(kind, text): what the compiled grammar depends on, for caching."""
        kind = self.kind
        if kind == "json":
            text = self.json if isinstance(self.json, str) else json.dumps(self.json)  # property order is output order
            return kind, text
        if kind == "choice":
            return "regex", choice_regex(self.choice or [])
        if kind == "json_object":
            return kind, ""
        return kind, getattr(self, kind)

    def check_grammar(self) -> None:
        """Raise ValueError with the parser's message when the schema, regex or grammar is malformed."""
        error = _grammar_error(*self.key())
        if error is not None:
            raise ValueError(f"structured outputs: invalid {self.kind}: {error}")


@lru_cache(maxsize=256)
def _grammar_error(kind: str, text: str) -> str | None:
    """The parser's complaint about one constraint, or None (remembered: the front end and the engine
    both check each request)."""
    import xgrammar

    if kind == "json":
        reason = unsatisfiable_reason(json.loads(text))
        if reason is not None:
            return f"no value can satisfy it ({reason})"
    try:
        if kind == "json":
            xgrammar.Grammar.from_json_schema(text)
        elif kind == "regex":
            xgrammar.Grammar.from_regex(text)
        elif kind == "grammar":
            xgrammar.Grammar.from_ebnf(text)
        elif kind == "structural_tag":
            xgrammar.Grammar.from_structural_tag(*structural_tag_arguments(text))
    except (RuntimeError, ValueError, TypeError) as error:
        return grammar_error(error)
    return None


def structural_tag_arguments(text: str) -> tuple[Any, ...]:
    """xgrammar's arguments for a structural tag: the JSON text itself, or for the older form its tags as
    StructuralTagItems and its triggers (ValueError when that form is malformed)."""
    import xgrammar

    tag = json.loads(text)
    if isinstance(tag, dict) and "structures" in tag:
        try:
            items = [xgrammar.StructuralTagItem(begin=s["begin"], schema=s["schema"], end=s["end"])
                     for s in tag["structures"]]
            triggers = [str(trigger) for trigger in tag["triggers"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError("each of structures needs begin, schema and end, and triggers must be a list of "
                             "strings") from None
        return items, triggers
    return (text,)


def _depth(value: object) -> int:
    """How deeply JSON objects and arrays nest in ``value`` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices``."""
    return "(" + "|".join(re.escape(choice) for choice in choices) + ")"


def grammar_error(error: BaseException) -> str:
    """xgrammar's message without its timestamp and C++ source location."""
    text = str(error).strip().strip("'\"")
    match = re.match(r"^\[[\d:]+\] \S+:\d+: (.*)$", text, re.S)
    return (match.group(1) if match else text).strip()
