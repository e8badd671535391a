"""Tool-call parsers on model output text: calls read out whole or not at all, the rest is content, and
a streamed answer is held back only where a call may begin."""

import json

import pytest

from tokenmill_server.tool_parsers import HermesParser, Llama3JsonParser, ParsedOutput, tool_call_parser


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


def test_parser_names():
    assert isinstance(tool_call_parser("hermes"), HermesParser)
    with pytest.raises(ValueError, match="hermes, llama3_json"):
        tool_call_parser("nope")
