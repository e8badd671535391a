"""Chat templates from requests render within an output-size and a time bound (BoundedSandbox)."""

from __future__ import annotations

import time

import jinja2
import pytest

from tokenmill.tokenizer.bounded_render import render_bounded
from tokenmill.tokenizer.template_sandbox import TemplateBounds, TemplateLimitError

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BIG = "{% set s = 'a' * 99999 %}{% set L = [s, s, s, s, s, s, s, s, s, s, s, s] %}"
NESTED = "{% for i in range(600) %}{% for j in range(600) %}{% for k in range(600) %}{% endfor %}{% endfor %}{% endfor %}"


def render(template: str, timeout: float = 1.0, **kwargs) -> str:
    return render_bounded(template, MESSAGES, TemplateBounds(1_000_000, timeout), **kwargs)


def test_ordinary_templates_render_as_with_hugging_face():
    assert render(CHATML, add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n"
    assert render(CHATML, continue_final_message=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo"
    assert render("{% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if loop.last %}!{% endif %}"
                  "{% endfor %}{% for x in [] %}{% else %}none{% endfor %}") == "1/22/2!none"
    assert render("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
                  "{{ ns.n }} {{ messages[0]|tojson }} {% generation %}g{% endgeneration %}") == \
        '2 {"role": "user", "content": "hi"} g'
    with pytest.raises(jinja2.TemplateError, match="no system"):
        render("{{ raise_exception('no system role') }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        render("{{ ''.__class__.__mro__ }}")


@pytest.mark.parametrize("template", [
    "{{ 'a' * 10**9 }}", "{{ 10**100000 }}", "{{ 'x'|center(10**9) }}", "{{ 'x'.ljust(10**9) }}",
    "{{ '{:>999999999}'.format(1) }}", "{{ '%999999999s' % 1 }}", "{{ [1] * 10**9 }}",
    "{% set s = 'a' * 9999 %}{{ s|replace('a', s) }}", "{% set s = 'a' * 9999 %}{{ s.replace('a', s) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    BIG + "{{ L }}", BIG + "{{ L|tojson }}", BIG + "{{ L|join }}", BIG + "{{ (L ~ '')|length }}",
    BIG + "{{ [L, L] * 2 }}", "{% for i in range(10) %}{{ 'a' * 999999 }}{% endfor %}",
])
def test_output_bombs_are_refused_before_they_allocate(template):
    started = time.monotonic()
    with pytest.raises(TemplateLimitError, match="longer than|larger than|too large|wider than"):
        render(template, timeout=30)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("template", [
    NESTED, "{% set s = 'a' * 300 %}{% for a in s %}{% for b in s %}{% for c in s %}{% endfor %}{% endfor %}{% endfor %}",
    "{% for a in range(99999) %}{% for b in range(99999) %}{% set x = a %}{% endfor %}{% endfor %}",
])
def test_long_loops_stop_at_the_deadline(template):
    started = time.monotonic()
    with pytest.raises(TemplateLimitError, match="within 0.5 s"):
        render(template, timeout=0.5)
    assert time.monotonic() - started < 1.5


def test_stop_ends_a_rendering_early():
    bounds = TemplateBounds(1_000_000, 60)
    bounds.stop()
    with pytest.raises(TemplateLimitError):
        render_bounded(NESTED, MESSAGES, bounds)
