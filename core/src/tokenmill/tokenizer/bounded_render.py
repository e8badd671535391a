"""render_bounded: a chat template from a request, rendered within bounds.

It renders in a ``BoundedSandbox`` with the globals and filters Hugging Face's
``apply_chat_template`` gives templates (``raise_exception``, ``strftime_now``, ``tojson`` with its
options, ``namespace``, ``dict``, loop controls and the ``generation`` tag), so templates written
for it render the same, within bounds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.utils import Namespace

from tokenmill.tokenizer.template_sandbox import BoundedSandbox, TemplateBounds, estimated_chars

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _namespace_class(bounds: TemplateBounds) -> type[Namespace]:
    class BoundedNamespace(Namespace):
        """A namespace that refuses underscore names and values past the bounds (loops accumulate here)."""

        def __setitem__(self, name: str, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attributes cannot start with '_': {name!r}")
            bounds.check_time()
            bounds.check_size(estimated_chars(value, bounds.max_chars), "a namespace value")
            super().__setitem__(name, value)

    return BoundedNamespace


def render_bounded(template: str, messages: Sequence[dict[str, Any]], bounds: TemplateBounds, *,
                   tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
                   add_generation_prompt: bool = False, continue_final_message: bool = False,
                   **kwargs: Any) -> str:
    """The prompt text: ``template`` over ``messages``; TemplateLimitError past ``bounds``, other Jinja
    errors as they come. ``continue_final_message`` ends the text inside the last message, as HF does."""
    environment = BoundedSandbox(bounds, filters={"tojson": _tojson},
                                 globals={"raise_exception": _raise_exception, "strftime_now": _strftime_now,
                                          "dict": dict, "namespace": _namespace_class(bounds)})
    compiled = environment.from_string(template)
    chat = [dict(message) for message in messages]
    if continue_final_message:
        if not chat or not isinstance(chat[-1].get("content"), str):
            raise ValueError("continue_final_message needs a final message with text content.")
        final = chat[-1]["content"]
        chat[-1]["content"] = final + _CONTINUE_TAG
    pieces, length = [], 0
    for piece in compiled.generate(messages=chat, tools=tools, documents=documents,
                                   add_generation_prompt=add_generation_prompt, **kwargs):
        length += len(piece)
        bounds.check_size(length, "a prompt")
        bounds.check_time()
        pieces.append(piece)
    text = "".join(pieces)
    if continue_final_message:
        at = text.rfind(_CONTINUE_TAG.strip())
        if at < 0 or final.strip() not in text:
            raise ValueError("continue_final_message is set but the chat template drops the final message.")
        text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
    return text
