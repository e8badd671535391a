"""ToolChoice without a model: which tool_choice values force a call, the constraint each makes, and the
tool calls read back from the generated JSON."""

import json

import pytest

from tokenmill_server.errors import ApiError
from tokenmill_server.tool_choice import ToolChoice

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def error(tools, choice) -> ApiError:
    with pytest.raises(ApiError) as caught:
        ToolChoice.from_request(tools, choice)
    return caught.value


def test_no_forced_call_without_tools_or_with_none():
    assert ToolChoice.from_request(None, None) is None
    assert ToolChoice.from_request([WEATHER], "none") is None


def test_auto_is_refused_with_a_way_forward():
    for choice in (None, "auto"):
        refused = error([WEATHER], choice)
        assert (refused.status, refused.param) == (400, "tool_choice") and "'required'" in refused.message


@pytest.mark.parametrize("tools, choice, param", [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    ([WEATHER], {"type": "function"}, "tool_choice"),
    ([{"type": "retrieval"}], "required", "tools"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "required", "tools"),
    ([WEATHER, WEATHER], "required", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": [1]}}], "required", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}], "required", "tools"),
])
def test_malformed_tools_or_choice_are_400(tools, choice, param):
    refused = error(tools, choice)
    assert (refused.status, refused.param) == (400, param), refused.message


def test_named_call_constrains_to_its_parameters():
    tool = ToolChoice.from_request([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    assert tool.constraint.json == WEATHER["function"]["parameters"] and tool.constraint.disable_any_whitespace
    assert tool.finish_reason == "stop"
    [call] = tool.calls('{"city":"Oslo"}')
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert tool.first_delta('{"ci')["function"] == {"name": "get_weather", "arguments": '{"ci'}


def test_required_constrains_to_an_array_of_calls():
    tool = ToolChoice.from_request([WEATHER, TIME], "required")
    schema = tool.constraint.json
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [c["properties"]["name"]["enum"] for c in schema["items"]["anyOf"]] == [["get_weather"], ["get_time"]]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object"}  # no parameters given
    assert tool.finish_reason == "tool_calls"
    calls = tool.calls('[{"name":"get_time","parameters":{}},{"name":"get_weather","parameters":{"city":"Å"}}]')
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Å"}
    assert len({c["id"] for c in calls}) == 2
    assert tool.calls('[{"name":"get_ti') == []  # cut short


def test_required_without_parallel_calls_makes_one():
    assert "maxItems" not in ToolChoice.from_request([WEATHER], "required", None).constraint.json
    assert ToolChoice.from_request([WEATHER], "required", False).constraint.json["maxItems"] == 1


def test_anthropic_tool_choice():
    tools = [{"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}},
             {"name": "ping"}]
    assert ToolChoice.from_anthropic(None, {"type": "any"}) is None
    assert ToolChoice.from_anthropic(tools, {"type": "none"}) is None
    named = ToolChoice.from_anthropic(tools, {"type": "tool", "name": "get_time"})
    assert named.named == "get_time" and named.constraint.json == tools[0]["input_schema"]
    required = ToolChoice.from_anthropic(tools, {"type": "any", "disable_parallel_tool_use": True})
    assert required.named is None and required.constraint.json["maxItems"] == 1
    assert [t["function"]["name"] for t in required.openai_tools()] == ["get_time", "ping"]
    for choice in (None, {"type": "auto"}):
        assert error_of_anthropic(tools, choice).param == "tool_choice"
    assert error_of_anthropic(tools, {"type": "tool", "name": "nope"}).param == "tool_choice"
    assert error_of_anthropic(["x"], {"type": "any"}).param == "tools"


def error_of_anthropic(tools, choice) -> ApiError:
    with pytest.raises(ApiError) as caught:
        ToolChoice.from_anthropic(tools, choice)
    return caught.value
