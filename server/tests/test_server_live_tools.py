"""Forced tool calls on the live tiny-model server: a named function's arguments come back as its
tool call (whole, or streamed piece by piece), "required" returns calls of the listed functions."""

import json

import httpx
from server_live import sse_events

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
