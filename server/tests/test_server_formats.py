"""Error shapes and sanitizing, logprobs formats, conversations for the chat template."""

import pytest

from tokenmill.outputs import Logprob
from tokenmill_server.conversation import anthropic_conversation, openai_conversation, template_options
from tokenmill_server.error_handlers import validation_message
from tokenmill_server.errors import ApiError, error_body, error_status, overloaded, sanitize
from tokenmill_server.logprobs import CompletionLogprobs, chat_logprobs, prompt_logprobs_json
from tokenmill_server.protocol.anthropic import MessagesRequest
from tokenmill_server.protocol.chat import ChatCompletionRequest
from tokenmill_server.sampling import RequestLimits


@pytest.mark.parametrize("text", ["cannot open /home/alice/models/x.gguf: denied", "bad file /tmp/tokenmill-ab12/requests",
                                  "in /work/main/core/src/tokenmill/engine/x.py line 3", r"C:\Users\bob\model failed",
                                  "template of /root/.cache/hf/tokenizer.json"])
def test_sanitize_removes_paths(text):
    cleaned = sanitize(text)
    assert "<path>" in cleaned
    for secret in ("alice", "tokenmill-ab12", "/work/main", "bob", ".cache"):
        assert secret not in cleaned


def test_sanitize_keeps_urls_and_cuts_long_text():
    assert sanitize("POST /v1/chat/completions failed") == "POST /v1/chat/completions failed"
    assert len(sanitize("x" * 5000)) == 2000


def test_error_shapes_by_route():
    error = ApiError(400, "bad", param="n", code="c")
    assert error_body(error, "/v1/completions") == {"error": {"message": "bad", "type": "invalid_request_error",
                                                              "param": "n", "code": "c"}}
    assert error_body(error, "/v1/messages") == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    busy = overloaded("full")
    assert error_status(busy, "/v1/completions") == 503 and busy.headers["Retry-After"] == "1"
    assert error_status(busy, "/v1/messages") == 529
    assert error_body(busy, "/v1/messages")["error"]["type"] == "overloaded_error"


def test_validation_message_names_fields_without_values():
    message, param = validation_message([
        {"loc": ("body", "messages", 0, "role"), "msg": "Input should be 'user'", "type": "literal_error", "input": "SECRET"},
        {"loc": ("body", "n"), "msg": "too small", "type": "greater_than_equal"}])
    assert param == "messages.0.role" and "n: too small" in message and "SECRET" not in message
    message, param = validation_message([{"loc": ("body", 7), "msg": "JSON decode error", "type": "json_invalid",
                                          "ctx": {"error": "Expecting value"}}])
    assert message == "Invalid JSON: Expecting value" and param is None


def positions():
    return [{5: Logprob(-0.5, 1, "a"), 6: Logprob(-1.0, 2, "bb")}, {7: Logprob(-3.0, 4, "c"), 5: Logprob(-0.1, 1, "a")}]


def test_completion_logprobs_lists_and_offsets():
    builder = CompletionLogprobs(top=1, as_ids=False, text_offset=10)
    result = builder.build([5, 7], positions())
    assert result["tokens"] == ["a", "c"] and result["token_logprobs"] == [-0.5, -3.0]
    assert result["top_logprobs"] == [{"a": -0.5}, {"a": -0.1, "c": -3.0}]  # the chosen token is always listed
    assert result["text_offset"] == [10, 11]
    assert builder.build([5], [None], texts=["x"]) == {"tokens": ["x"], "token_logprobs": [None], "top_logprobs": [None],
                                                        "text_offset": [12]}
    assert CompletionLogprobs(0, as_ids=True).build([5], positions()[:1])["tokens"] == ["token_id:5"]


def test_chat_logprobs_and_prompt_logprobs():
    result = chat_logprobs([5, 7], positions(), top=1, as_ids=False)
    first = result["content"][0]
    assert first == {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]}]}
    assert result["content"][1]["top_logprobs"][0]["token"] == "a"
    infinite = chat_logprobs([5], [{5: Logprob(float("-inf"), 9, "a")}], top=0, as_ids=False)
    assert infinite["content"][0]["logprob"] == -9999.0
    assert prompt_logprobs_json([None, {5: Logprob(-1.0, 3, "a")}]) == [None, {"5": {"logprob": -1.0, "rank": 3,
                                                                                     "decoded_token": "a"}}]


def test_openai_conversation_joins_text_and_refuses_images():
    request = ChatCompletionRequest.model_validate({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]})
    assert openai_conversation(request.messages) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]
    image = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/"}}]}]})
    with pytest.raises(ApiError) as caught:
        openai_conversation(image.messages)
    assert caught.value.param == "messages.0.content" and "not supported" in caught.value.message
    surrogate = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "\ud800"}]})
    with pytest.raises(ApiError):
        openai_conversation(surrogate.messages)


def test_anthropic_conversation_puts_the_system_prompt_first():
    request = MessagesRequest.model_validate({"max_tokens": 1, "system": [{"type": "text", "text": "sys"}],
                                              "messages": [{"role": "user", "content": "hi"}]})
    assert anthropic_conversation(request.system, request.messages) == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]


def test_template_options_gate_request_templates():
    limits = RequestLimits()
    with pytest.raises(ApiError):
        template_options("{{ x }}", None, True, False, limits)
    with pytest.raises(ApiError):
        template_options(None, {"chat_template": "{{ x }}"}, True, False, limits)
    with pytest.raises(ApiError):
        template_options(None, None, True, True, limits)
    options = template_options(None, {"enable_thinking": True, "tokenize": True, "return_dict": True}, False, True, limits)
    assert options == {"enable_thinking": True, "chat_template": None, "add_generation_prompt": False,
                       "continue_final_message": True}
    trusted = template_options("{{ x }}", None, True, False, RequestLimits(trust_request_chat_template=True))
    assert trusted["chat_template"] == "{{ x }}"


def test_error_messages_and_params_always_encode():
    error = ApiError(404, "The model `\ud800` does not exist.", param="logit_bias.\udfff")
    body = error_body(error, "/v1/completions")["error"]
    assert body["message"] == "The model `\\ud800` does not exist." and body["param"] == "logit_bias.\\udfff"
    assert error_body(error, "/v1/messages")["error"]["message"].encode("utf-8")
