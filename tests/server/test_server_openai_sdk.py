"""The official openai SDK against ``tokenmill serve`` with the real SmolLM2 model."""

import json

import openai
import pytest

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"  # served under the GGUF file's name


@pytest.fixture(scope="module")
def client(smollm2_server):
    return openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_and_startup_time(client, smollm2_server):
    print(f"tokenmill serve (SmolLM2) was ready {smollm2_server.ready_after:.1f} s after launch")
    assert smollm2_server.ready_after < 120
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]


def test_chat_completion(client):
    response = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2+2?"}],
                                              max_tokens=8, temperature=0)
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert response.usage.prompt_tokens > 10 and 0 < response.usage.completion_tokens <= 8


def test_chat_stream_matches_the_non_streamed_answer(client):
    messages = [{"role": "user", "content": "Name a color."}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt again: prefix cache hits


def test_completions_with_logprobs_n_and_extra_sampling(client):
    response = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, n=2,
                                         logprobs=2, temperature=0.8, seed=3,
                                         extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1})
    assert len(response.choices) == 2
    for choice in response.choices:
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == 3
        assert all(len(top) >= 2 for top in choice.logprobs.top_logprobs)
    greedy = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0)
    assert "Paris" in greedy.choices[0].text


def test_completion_stream(client):
    stream = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) and chunks[-1].choices[0].finish_reason == "length"


def test_sdk_errors(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=5)
    assert caught.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="word " * 3000, max_tokens=5)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": {"type": "nope"}}})
    assert caught.value.body["param"] == "response_format" and "invalid json" in caught.value.message


def test_structured_outputs(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person named Ann, aged 31, as JSON."}],
        temperature=0, max_tokens=60, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    person = json.loads(reply.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int) and reply.choices[0].finish_reason == "stop"
    reply = client.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=5, temperature=0,
                                      extra_body={"structured_outputs": {"choice": [" yes", " no"]}})
    assert reply.choices[0].text in (" yes", " no")


def test_forced_tool_call(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                               "parameters": {"type": "object", "required": ["city"], "properties": {
                                                   "city": {"type": "string", "maxLength": 30}}}}}]
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], temperature=0,
        max_tokens=40, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
