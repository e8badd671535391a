"""The official anthropic SDK against ``tokenmill serve`` with the real SmolLM2 model."""

import anthropic
import pytest

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"  # served under the GGUF file's name


@pytest.fixture(scope="module")
def client(smollm2_server):
    return anthropic.Anthropic(base_url=smollm2_server.url, api_key="unused", max_retries=0, timeout=120)


def test_messages_create(client):
    message = client.messages.create(model=MODEL, max_tokens=8, system="Answer briefly.",
                                     messages=[{"role": "user", "content": "What is the capital of France?"}],
                                     extra_body={"temperature": 0})
    assert message.role == "assistant" and message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and 0 < message.usage.output_tokens <= 8


def test_messages_stream_matches_create(client):
    messages = [{"role": "user", "content": "Say hello."}]
    # Both answers below then reuse the same cached prompt blocks: in bfloat16 (the default where the CPU
    # multiplies it natively) a prompt computed whole and one computed past a cached prefix can round
    # differently, enough to flip a near-tie of this model's greedy choice.
    client.messages.create(model=MODEL, max_tokens=1, messages=messages, extra_body={"temperature": 0})
    full = client.messages.create(model=MODEL, max_tokens=6, messages=messages, extra_body={"temperature": 0})
    with client.messages.stream(model=MODEL, max_tokens=6, messages=messages, extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full.content[0].text == final.content[0].text
    assert final.usage.output_tokens == full.usage.output_tokens and final.stop_reason == full.stop_reason


def test_stop_sequences_and_count_tokens(client):
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Count to five."}])
    assert counted.input_tokens > 5
    message = client.messages.create(model=MODEL, max_tokens=20, extra_body={"temperature": 0}, stop_sequences=["3"],
                                     messages=[{"role": "user", "content": "Count from 1 to 10 with commas."}])
    if message.stop_reason == "stop_sequence":
        assert message.stop_sequence == "3" and "3" not in message.content[0].text


def test_sdk_errors(client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert caught.value.body["error"]["type"] == "invalid_request_error"


def test_forced_tool_use(client):
    tools = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = client.messages.create(model=MODEL, max_tokens=40, messages=messages, tools=tools,
                                     tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    [use] = message.content
    assert use.type == "tool_use" and use.name == "get_weather" and isinstance(use.input["city"], str)
    assert message.stop_reason == "tool_use" and use.id.startswith("toolu_")
    with client.messages.stream(model=MODEL, max_tokens=40, messages=messages, tools=tools,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                extra_body={"temperature": 0}) as stream:
        pieces = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use" and final.content[0].input == use.input
    assert len(pieces) > 1  # the input streams as it is generated
    assert final.stop_reason == "tool_use"
