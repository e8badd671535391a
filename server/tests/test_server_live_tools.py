"""Forced tool calls on the live tiny-model server: a named function's arguments come back as its
tool call (whole, or streamed piece by piece), "required" returns calls of the listed functions."""

import json

import httpx
import pytest
from server_live import LiveServer, sse_events

USER = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(server, **body):
    response = httpx.post(server.url + "/v1/chat/completions",
                          json={"messages": USER, "max_tokens": 40, "temperature": 0, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_named_function_call(tiny_server):
    choice = chat(tiny_server, tools=[WEATHER, TIME], tool_choice=NAMED)
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert arguments["city"] in ("Oslo", "Rome") and arguments["days"] in (1, 2, 3)


def test_required_calls_listed_functions(tiny_server):
    # one call (parallel_tool_calls false): a random model may otherwise keep adding calls to the array
    choice = chat(tiny_server, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
                  max_tokens=120)
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] in ("get_weather", "get_time")
    assert set(json.loads(call["function"]["arguments"])) in ({"city", "days"}, {"zone"})


def test_named_function_call_streams_its_arguments(tiny_server):
    whole = chat(tiny_server, tools=[WEATHER], tool_choice=NAMED)["message"]["tool_calls"][0]
    with httpx.stream("POST", tiny_server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": USER, "max_tokens": 40, "temperature": 0, "stream": True,
                            "tools": [WEATHER], "tool_choice": NAMED}) as response:
        chunks = [json.loads(d) for _, d in sse_events(response) if d != "[DONE]"]
    pieces = [c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"]]
    pieces = [p[0] for p in pieces if p]
    assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"].startswith("chatcmpl-tool-")
    assert "".join(p["function"]["arguments"] for p in pieces) == whole["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks if c["choices"])


def test_forced_call_with_response_format_is_400(tiny_server):
    response = httpx.post(tiny_server.url + "/v1/chat/completions", timeout=60,
                          json={"messages": USER, "tools": [WEATHER], "tool_choice": NAMED,
                                "response_format": {"type": "json_object"}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"


def _auto_tool_server(tiny_model, tmp_path_factory, parser):
    server = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--enable-auto-tool-choice",
                        "--tool-call-parser", parser, log=tmp_path_factory.mktemp(parser) / "server.log")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def auto_server(tiny_model, tmp_path_factory):
    yield from _auto_tool_server(tiny_model, tmp_path_factory, "hermes")


# the tiny model's words are random: a regex makes it answer as a Hermes-style model would
HERMES_CALL = r'Checking\.<tool_call>\{"name": "get_time", "arguments": \{"zone": "UTC"\}\}</tool_call>'


def test_auto_reads_calls_in_the_models_syntax(auto_server):
    choice = chat(auto_server, tools=[WEATHER, TIME], max_tokens=120, structured_outputs={"regex": HERMES_CALL})
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '{"zone": "UTC"}'}
    plain = chat(auto_server, tools=[WEATHER], tool_choice="auto", structured_outputs={"regex": "Hi there"})
    assert plain["message"] == {"role": "assistant", "content": "Hi there", "tool_calls": []}
    assert plain["finish_reason"] == "stop"


def test_auto_streams_content_then_calls(auto_server):
    with httpx.stream("POST", auto_server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": USER, "max_tokens": 120, "temperature": 0, "stream": True,
                            "tools": [WEATHER, TIME], "structured_outputs": {"regex": HERMES_CALL}}) as response:
        chunks = [json.loads(d) for _, d in sse_events(response) if d != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    [calls] = [d["tool_calls"] for d in deltas if d.get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_time" and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_anthropic_auto_tool_use(auto_server):
    from tokenmill_server.serving_messages import _MessageView
    from tokenmill_server.tool_choice import ToolChoice

    tools = [{"name": "get_time", "input_schema": TIME["function"]["parameters"]}]
    response = httpx.post(auto_server.url + "/v1/messages", timeout=60,
                          json={"max_tokens": 5, "messages": USER, "temperature": 0, "tools": tools})
    assert response.status_code == 200, response.text  # accepted; this random model answers in text
    assert response.json()["content"][0]["type"] == "text"
    view = _MessageView("msg_1", "m", 3, ToolChoice.from_anthropic(tools, None, "hermes"))
    blocks = view.content_blocks('Checking.<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>')
    assert [b["type"] for b in blocks] == ["text", "tool_use"] and blocks[1]["input"] == {"zone": "UTC"}
    assert blocks[1]["id"].startswith("toolu_") and blocks[0]["text"] == "Checking."
    assert view.content_blocks("plain") == [{"type": "text", "text": "plain"}]


def test_required_streams_its_calls_whole_at_the_end(tiny_server):
    body = {"messages": USER, "max_tokens": 120, "temperature": 0, "tools": [WEATHER, TIME],
            "tool_choice": "required", "parallel_tool_calls": False}
    whole = chat(tiny_server, **{k: v for k, v in body.items() if k != "messages"})
    with httpx.stream("POST", tiny_server.url + "/v1/chat/completions", timeout=60,
                      json={**body, "stream": True}) as response:
        chunks = [json.loads(d) for _, d in sse_events(response) if d != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    [calls] = [d["tool_calls"] for d in deltas if d.get("tool_calls")]
    assert [c["function"] for c in calls] == [c["function"] for c in whole["message"]["tool_calls"]]
    assert not any(d.get("content") for d in deltas) and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.fixture(scope="module")
def pythonic_server(tiny_model, tmp_path_factory):
    yield from _auto_tool_server(tiny_model, tmp_path_factory, "pythonic")


PYTHONIC_CALLS = r'\[get_weather\(city="Rome", days=2\), get_time\(zone="CET"\)\]'


def test_pythonic_parser_reads_a_list_of_calls(pythonic_server):
    choice = chat(pythonic_server, tools=[WEATHER, TIME], max_tokens=120, structured_outputs={"regex": PYTHONIC_CALLS})
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Rome", "days": 2}'},
        {"name": "get_time", "arguments": '{"zone": "CET"}'}]
    with httpx.stream("POST", pythonic_server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": USER, "max_tokens": 120, "temperature": 0, "stream": True, "tools": [WEATHER, TIME],
                            "structured_outputs": {"regex": PYTHONIC_CALLS}}) as response:
        chunks = [json.loads(d) for _, d in sse_events(response) if d != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not any(d.get("content") for d in deltas)  # held back while it may be calls, then it was
    [calls] = [d["tool_calls"] for d in deltas if d.get("tool_calls")]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]


@pytest.fixture(scope="module")
def mistral_server(tiny_model, tmp_path_factory):
    yield from _auto_tool_server(tiny_model, tmp_path_factory, "mistral")


def test_mistral_parser_keeps_special_tokens_in_the_text(mistral_server, auto_server):
    # Mistral's [TOOL_CALLS] and [ARGS] are special tokens: the text keeps them (forced here: <|im_start|>,
    # id 1, a special token of the tiny tokenizer) so that the parser can find its markers
    body = {"tools": [WEATHER], "max_tokens": 3, "logit_bias": {"1": 100}}
    assert chat(mistral_server, **body)["message"]["content"] == "<|im_start|>" * 3
    assert not chat(auto_server, **body)["message"]["content"]
