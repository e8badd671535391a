"""Tool-call parsers on model output text: calls read out whole or not at all, the rest is content, and
a streamed answer is held back only where a call may begin."""

import json

import pytest

from tokenmill_server.tool_choice import ToolChoice
from tokenmill_server.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ParsedOutput,
    PythonicParser,
    tool_call_parser,
)


def test_hermes_blocks_after_text():
    text = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n' \
           '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
    parsed = HermesParser().parse(text)
    assert parsed.content == "Let me check."
    assert parsed.calls == [("get_time", '{"zone": "UTC"}'), ("ping", "{}")]


@pytest.mark.parametrize("text", ["no calls here", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
                                  "<tool_call>not json</tool_call>", '<tool_call>{"arguments": {}}</tool_call>'])
def test_hermes_text_that_is_not_calls_stays_content(text):
    assert HermesParser().parse(text) == ParsedOutput(text)


def test_hermes_unclosed_last_block_and_calls_only():
    parsed = HermesParser().parse('<tool_call>{"name": "f", "arguments": {"a": "é"}}')
    assert parsed.content is None and json.loads(parsed.calls[0][1]) == {"a": "é"}


def test_hermes_streaming_holds_back_only_a_possible_start():
    parser = HermesParser()
    assert parser.content_end("Hello") == 5
    assert parser.content_end("Hello <tool") == len("Hello ")
    assert parser.content_end("Hello <tool_call>{") == len("Hello ")
    assert parser.content_end("a < b") == 5


def test_llama3_json_calls_and_content():
    parser = Llama3JsonParser()
    parsed = parser.parse('<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}; {"name": "ping", '
                          '"parameters": {}}')
    assert parsed.content is None and parsed.calls == [("get_time", '{"zone": "UTC"}'), ("ping", "{}")]
    assert parser.parse('{"name": "f", "arguments": {"x": 1}}').calls == [("f", '{"x": 1}')]
    for text in ("The answer is 4.", '{"name": "f", "parameters": {}} and more', '{"nope": 1}'):
        assert parser.parse(text) == ParsedOutput(text)


def test_llama3_json_streaming_holds_back_a_possible_call():
    parser = Llama3JsonParser()
    assert parser.content_end("") == 0 and parser.content_end("  {") == 0 and parser.content_end("<|py") == 0
    assert parser.content_end("Sure") == 4


def test_mistral_calls_after_the_marker_or_as_the_whole_answer():
    parser = MistralParser()
    text = 'Checking.[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}, {"name": "ping", "arguments": {}}]'
    assert parser.parse(text) == ParsedOutput("Checking.", [("get_time", '{"zone": "UTC"}'), ("ping", "{}")])
    # the marker is a special token: detokenized without it, a whole answer that is the list still reads as calls
    assert parser.parse(' [{"name": "f", "arguments": {"x": 1}}]') == ParsedOutput(None, [("f", '{"x": 1}')])
    assert parser.parse('[TOOL_CALLS]{"name": "f", "arguments": {}}').calls == [("f", "{}")]
    for text in ("The list [1, 2] is short.", "[]", '[{"name": "f", "arguments": [1]}]', "[TOOL_CALLS][{bad",
                 '[{"arguments": {}}]', '[{"name": "f"}, 3]'):
        assert parser.parse(text) == ParsedOutput(text)


def test_mistral_v11_calls_by_name():
    parser = MistralParser()
    text = 'Checking.[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}[TOOL_CALLS]ping[ARGS]{}'
    assert parser.parse(text) == ParsedOutput("Checking.", [("get_time", '{"zone": "UTC"}'), ("ping", "{}")])
    # the [ARGS] marker dropped by a tokenizer, and v13's [CALL_ID] before it
    assert parser.parse('[TOOL_CALLS]f{"x": [1, 2]}').calls == [("f", '{"x": [1, 2]}')]
    assert parser.parse('[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{"zone": "CET"}\n').calls == [
        ("get_time", '{"zone": "CET"}')]
    for text in ("[TOOL_CALLS]f[ARGS]", '[TOOL_CALLS]f[ARGS]{"x": 1', '[TOOL_CALLS]f[ARGS][1]',
                 '[TOOL_CALLS]f[ARGS]{} trailing words', '[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{bad',
                 '[TOOL_CALLS]two words{}', 'get_time[ARGS]{"zone": "UTC"}'):
        assert parser.parse(text) == ParsedOutput(text)


def test_only_the_mistral_parser_keeps_special_tokens():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert ToolChoice.from_request(tools, None, parser="mistral").keeps_special_tokens
    assert not ToolChoice.from_request(tools, None, parser="hermes").keeps_special_tokens
    assert not ToolChoice.from_request(tools, "required", parser="mistral").keeps_special_tokens


def test_mistral_streaming_holds_back_a_possible_marker_or_list():
    parser = MistralParser()
    assert parser.content_end("") == 0 and parser.content_end(" [") == 0 and parser.content_end("[TOOL") == 0
    assert parser.content_end("Sure, [TOOL") == len("Sure, ")
    assert parser.content_end("Sure.[TOOL_CALLS][{") == len("Sure.")
    assert parser.content_end("Sure") == 4


def test_pythonic_calls_with_literal_arguments():
    parser = PythonicParser()
    parsed = parser.parse('[get_weather(city="Paris", days=3, units=None, hourly=True), ping()]')
    assert parsed.content is None
    assert parsed.calls == [("get_weather", '{"city": "Paris", "days": 3, "units": null, "hourly": true}'),
                            ("ping", "{}")]
    assert parser.parse('<|python_start|>[f(tags=["a", "b"], spec={"k": 1.5})]<|python_end|>').calls == [
        ("f", '{"tags": ["a", "b"], "spec": {"k": 1.5}}')]


@pytest.mark.parametrize("text", [
    "Paris is sunny.", "[1, 2, 3]", "[]", "[f(1)]", "[obj.method(a=1)]", "[f(**kw)]", "[f(a=g())]",
    "[f(a=__import__('os').system('true'))]", "[f(a=float('nan'))]", "[f(a={1, 2})]", "[f(a=1)] and more",
    "[f(a=" + "[" * 5000 + "]" * 5000 + ")]",  # nesting past the parser's limits
])
def test_pythonic_text_that_is_not_literal_calls_stays_content(text):
    assert PythonicParser().parse(text) == ParsedOutput(text)


def test_pythonic_never_evaluates_the_output(monkeypatch):
    import builtins

    monkeypatch.setattr(builtins, "eval", lambda *a, **k: pytest.fail("eval called"))
    assert PythonicParser().parse('[f(a=__import__("os"))]') == ParsedOutput('[f(a=__import__("os"))]')


def test_pythonic_streaming_holds_back_a_possible_call_list():
    parser = PythonicParser()
    assert parser.content_end("") == 0 and parser.content_end(" [get_") == 0 and parser.content_end("<|python") == 0
    assert parser.content_end("Hello") == 5


def test_parser_names():
    assert isinstance(tool_call_parser("hermes"), HermesParser)
    assert isinstance(tool_call_parser("mistral"), MistralParser)
    assert isinstance(tool_call_parser("pythonic"), PythonicParser)
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral, pythonic"):
        tool_call_parser("nope")
