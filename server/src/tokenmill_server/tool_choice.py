"""ToolChoice: how a request's tools shape its output, and how the output reads back as ``tool_calls``.

A named function constrains the output (a structured-output JSON schema) to that function's parameters:
the JSON is the call's ``arguments``, streamed as it comes. ``"required"`` constrains it to a non-empty
JSON array of ``{"name", "parameters"}`` objects, one per call (sent whole when the output ends).
``"auto"`` leaves the output free and reads calls from the model's own syntax with the server's
``--tool-call-parser``; without one it is refused.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from tokenmill.structured import StructuredOutputsParams
from tokenmill_server.errors import bad_request, unsupported
from tokenmill_server.tool_parsers import tool_call_parser

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _parameters(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each function's name -> its parameters schema; 400 for a malformed or repeated definition."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise bad_request("Each tool must be {'type': 'function', 'function': {...}}.", "tools")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request("Tool function names are 1-64 letters, digits, '_', '.' or '-'.", "tools")
        if name in found:
            raise bad_request(f"Tool function {name!r} is defined twice.", "tools")
        parameters = function.get("parameters", _ANY_OBJECT)
        if not isinstance(parameters, Mapping):
            raise bad_request(f"The parameters of tool function {name!r} must be a JSON schema object.", "tools")
        found[name] = dict(parameters) or _ANY_OBJECT
    return found


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-tool-{secrets.token_hex(12)}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


class ToolChoice:
    """The tool call a request forces: its output constraint, and how the output reads as tool calls."""

    def __init__(self, functions: dict[str, dict[str, Any]], named: str | None, parallel: bool = True,
                 parser: str | None = None) -> None:
        self.functions = functions
        self.named = named  # None: "required" (one or more calls of any of the functions), or "auto"
        self.parallel = parallel  # False: "required" makes exactly one call
        self.parser = tool_call_parser(parser) if parser is not None else None  # set: "auto"

    @classmethod
    def from_request(cls, tools: list[dict[str, Any]] | None, choice: str | dict[str, Any] | None,
                     parallel_tool_calls: bool | None = None, parser: str | None = None) -> ToolChoice | None:
        """None without tools or for tool_choice "none"; 400 for a bad choice, and for "auto" (the default
        with tools) when the server has no ``parser``. ``parallel_tool_calls`` false limits "required" to
        one call."""
        if not tools or choice == "none":
            return None
        functions = _parameters(tools)
        if (choice is None or choice == "auto") and parser is not None:
            return cls(functions, None, parser=parser)
        if choice is None or choice == "auto":
            raise unsupported("Tool calling with tool_choice 'auto' (it needs a parser for the model's own "
                              "tool-call format: start the server with --enable-auto-tool-choice --tool-call-parser); "
                              "force a call (OpenAI: 'required' or a named function; Anthropic: 'any' or "
                              "'tool'), or pass 'none'", "tool_choice")
        if choice == "required":
            tool = cls(functions, None, parallel=parallel_tool_calls is not False)
        else:
            function = choice.get("function") if isinstance(choice, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else None
            if name not in functions:
                raise bad_request("tool_choice names a function that is not among the tools.", "tool_choice")
            tool = cls(functions, name)
        try:
            tool.constraint.check_grammar()
        except ValueError as error:
            raise bad_request(f"tools: {error}", "tools") from None
        return tool

    @classmethod
    def from_anthropic(cls, tools: list[dict[str, Any]] | None, choice: dict[str, Any] | None,
                       parser: str | None = None) -> ToolChoice | None:
        """The same from Anthropic's tools (``name``, ``input_schema``) and tool_choice (``{"type": "tool",
        "name"}`` a named call, ``"any"`` one or more calls, ``"auto"`` refused, ``"none"``)."""
        if not tools:
            return None
        if any(not isinstance(tool, Mapping) for tool in tools):
            raise bad_request("Each tool must be an object with a name and an input_schema.", "tools")
        functions = [{"type": "function", "function": {"name": tool.get("name"),
                                                       "parameters": tool.get("input_schema", _ANY_OBJECT)}}
                     for tool in tools]
        kind = (choice or {}).get("type", "auto")
        parallel = not (choice or {}).get("disable_parallel_tool_use", False)
        if kind == "tool":
            return cls.from_request(functions, {"type": "function", "function": {"name": choice.get("name")}})
        openai_choice = {"any": "required", "none": "none"}.get(kind, "auto")
        return cls.from_request(functions, openai_choice, parallel, parser)

    def openai_tools(self) -> list[dict[str, Any]]:
        """The functions as OpenAI tool definitions (what chat templates expect)."""
        return [{"type": "function", "function": {"name": name, "parameters": parameters}}
                for name, parameters in self.functions.items()]

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the output's text must keep special tokens: the parser reads markers that are ones."""
        return self.parser is not None and self.parser.keeps_special_tokens

    @property
    def forced(self) -> bool:
        """Whether the output is constrained to calls (a named function or "required"), not "auto"."""
        return self.parser is None

    @cached_property
    def constraint(self) -> StructuredOutputsParams | None:
        """The JSON the output must be: the named function's arguments, or an array of calls (None: "auto")."""
        if self.parser is not None:
            return None
        if self.named is not None:
            schema = self.functions[self.named]
        else:
            calls = [{"type": "object", "properties": {"name": {"enum": [name]}, "parameters": parameters},
                      "required": ["name", "parameters"], "additionalProperties": False}
                     for name, parameters in self.functions.items()]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
            if not self.parallel:
                schema["maxItems"] = 1
        # compact JSON: programs read the arguments, and a small model may otherwise pad them with whitespace
        return StructuredOutputsParams(json=schema, disable_any_whitespace=True)

    @property
    def finish_reason(self) -> str:
        """OpenAI's: a named function ends with "stop", calls the model chose end with "tool_calls"."""
        return "stop" if self.named is not None else "tool_calls"

    def calls(self, text: str) -> list[dict[str, Any]]:
        """The tool calls a whole output makes (none when it was cut short before its JSON closed, or
        when an "auto" answer called nothing)."""
        return self.parse(text)[1]

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """A whole output as (content, tool calls): a forced call has no content; an "auto" answer
        without calls is all content."""
        if self.parser is not None:
            parsed = self.parser.parse(text)
            return parsed.content, [_call(name, arguments) for name, arguments in parsed.calls]
        if self.named is not None:
            return None, [_call(self.named, text)]
        try:
            calls = json.loads(text)
        except ValueError:
            return text, []
        return None, [_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]

    def content_end(self, text: str) -> int:
        """How much of a streamed "auto" answer is surely content (the rest may be a call's start)."""
        return self.parser.content_end(text) if self.parser is not None else 0

    def first_delta(self, text: str) -> dict[str, Any]:
        """A named call's first streamed piece: its id and name with the arguments so far."""
        call = _call(self.named or "", text)
        return {"index": 0, **call}
