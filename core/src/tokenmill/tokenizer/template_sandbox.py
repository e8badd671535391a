"""BoundedSandbox: a Jinja sandbox that bounds a request template's output size and running time.

For chat templates that come with requests: with their bounds (``TemplateBounds``) a template
cannot exhaust memory or hold a thread.

Jinja's immutable sandbox already keeps templates from Python internals and from mutating lists and
dicts; this one also:
- refuses an operation whose result would exceed ``max_chars``, checked *before* it runs: ``*``, ``+``
  and ``**`` on strings, lists and integers, ``%`` and ``format`` widths, integer arguments larger
  than ``max_chars`` (``center(10**9)``), and the estimated text of every filter's, call's,
  concatenation's (``~``) and output's values (``[s] * 1000`` of a long ``s`` counts its text);
- checks the deadline at every loop step, attribute, item, call, filter, operator, output and
  namespace assignment (cooperative checks: a single slow operation in C is not interrupted, which
  is why the operations that could be slow are bounded first);
- refuses output past ``max_chars`` in total.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment

_FORMAT_FIELD = re.compile(r"\{[^{}]*\}|%[^a-zA-Z%]*")
_DIGITS = re.compile(r"\d+")
_CHECKED_STEPS = "_checked_steps"  # the filter every for loop's iterable passes through
_MAX_INT_BITS = 1 << 16  # integers beyond 65536 bits (about 20,000 digits) are refused


class TemplateLimitError(ValueError):
    """A request's chat template went past its output-size or time bound."""


@dataclass
class TemplateBounds:
    """The limits of one rendering: ``max_chars`` of output (and of any value made on the way) and
    ``timeout`` seconds from creation. ``stop()`` makes the next check fail (the caller gave up)."""

    max_chars: int
    timeout: float
    deadline: float = field(init=False)
    _stopped: threading.Event = field(init=False, default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def stop(self) -> None:
        self._stopped.set()

    def check_time(self) -> None:
        if self._stopped.is_set() or time.monotonic() > self.deadline:
            raise TemplateLimitError(f"The chat template did not finish rendering within {self.timeout:g} s.")

    def check_size(self, chars: int, what: str = "a value") -> None:
        if chars > self.max_chars:
            raise TemplateLimitError(f"The chat template made {what} longer than the {self.max_chars} characters "
                                     f"allowed.")


def estimated_chars(value: Any, limit: int) -> int:
    """About how many characters ``value`` prints as (strings, numbers, and lists and mappings of them,
    shared parts counted each time); the walk stops once past ``limit``."""
    total, pending = 0, [value]
    while pending and total <= limit:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            total += item.bit_length() // 3 + 2
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            pending.extend(item)
        else:
            total += 24
    return total


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles ``a ~ b`` to the environment's bounded concatenation."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (Hugging Face's assistant-mask tag) renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable sandbox whose every operation respects ``bounds`` (see the module's docstring)."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, bounds: TemplateBounds, filters: Mapping[str, Callable[..., Any]],
                 globals: Mapping[str, Any]) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag],
                         finalize=self._finalize)
        self.bounds = bounds
        self.filters.update(filters)
        self.filters = {name: self._bounded(name, function) for name, function in self.filters.items()}
        self.globals.update(globals)
        self.filters[_CHECKED_STEPS] = self._checked_steps

    def _parse(self, source: str, name: str | None, filename: str | None) -> jinja2.nodes.Template:
        """The template's tree, every ``for`` loop iterating through ``_checked_steps``."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(jinja2.nodes.For):
            loop.iter = jinja2.nodes.Filter(loop.iter, _CHECKED_STEPS, [], [], None, None, lineno=loop.lineno)
        return tree

    def _checked_steps(self, iterable: Any) -> Iterator[Any]:
        """``iterable``'s items, the deadline checked before each."""
        for item in iterable:
            self.bounds.check_time()
            yield item

    # -- checks --------------------------------------------------------------------------------

    def _check_values(self, values: tuple[Any, ...], what: str) -> None:
        limit = self.bounds.max_chars
        for value in values:
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
                raise TemplateLimitError(f"The chat template passed {what} a number larger than {limit}.")
            self.bounds.check_size(estimated_chars(value, limit), f"a value for {what}")

    def _check_format(self, text: str) -> None:
        for spec in _FORMAT_FIELD.findall(text):
            if any(int(digits) > self.bounds.max_chars for digits in _DIGITS.findall(spec)):
                raise TemplateLimitError("The chat template formats a field wider than the output allows.")

    def _bounded(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)  # keeps jinja's pass_context / pass_eval_context marks
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self.bounds.check_time()
            self._check_values((*args, *kwargs.values()), "a filter")
            if name == "replace" and len(args) >= 4:  # (eval_ctx, text, old, new)
                self._check_replace(*args[1:4])
            if name == "format" and args and isinstance(args[0], str):
                self._check_format(args[0])
            return function(*args, **kwargs)

        return bounded

    def _check_replace(self, text: Any, old: Any, new: Any) -> None:
        if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
            count = text.count(old) if old else len(text) + 1
            self.bounds.check_size(len(text) + count * (len(new) - len(old)), "a replacement")

    # -- sandbox hooks -------------------------------------------------------------------------

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        bounds = self.bounds
        bounds.check_time()
        limit = bounds.max_chars
        if operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if isinstance(times, int) and not isinstance(sequence, (int, float)):
                    bounds.check_size(estimated_chars(sequence, limit) * max(times, 0), "a repetition")
            if isinstance(left, int) and isinstance(right, int) and \
                    left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise TemplateLimitError("The chat template made a number too large.")
        elif operator == "+" and not isinstance(left, (int, float)):
            bounds.check_size(estimated_chars(left, limit) + estimated_chars(right, limit), "a concatenation")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                right * left.bit_length() > _MAX_INT_BITS:
            raise TemplateLimitError("The chat template made a number too large.")
        elif operator == "%" and isinstance(left, str):
            self._check_format(left)
            self._check_values(right if isinstance(right, tuple) else (right,), "a % format")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self.bounds.check_time()
        __self._check_values((*args, *kwargs.values()), "a call")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            name = getattr(__obj, "__name__", "")
            if name == "replace" and len(args) >= 2:
                __self._check_replace(owner, args[0], args[1])
            elif name in ("format", "format_map"):
                __self._check_format(owner)
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.bounds.check_time()
        value = super().getattr(obj, attribute)
        if attribute in ("format", "format_map") and isinstance(obj, str):
            self._check_format(obj)
        return value

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.bounds.check_time()
        return super().getitem(obj, argument)

    def bounded_concat(self, values: tuple[Any, ...]) -> str:
        """``a ~ b ~ ...``: their text joined, refused before it would be too long."""
        self.bounds.check_time()
        self.bounds.check_size(sum(estimated_chars(v, self.bounds.max_chars) for v in values), "a concatenation")
        return "".join(str(v) for v in values)

    def _finalize(self, value: Any) -> Any:
        self.bounds.check_time()
        self.bounds.check_size(estimated_chars(value, self.bounds.max_chars), "an output")
        return value
