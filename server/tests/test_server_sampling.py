"""The protocol layer without a model: request models -> SamplingParams, caps, unsupported fields."""

import math
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from tokenmill.sampling_params import RequestOutputKind
from tokenmill_server.errors import ApiError
from tokenmill_server.protocol.anthropic import MessagesRequest
from tokenmill_server.protocol.chat import ChatCompletionRequest
from tokenmill_server.protocol.completion import CompletionRequest
from tokenmill_server.sampling import (
    ModelLimits,
    RequestLimits,
    build_sampling_params,
    check_common,
    check_context,
    check_model,
    logit_bias,
    stop_strings,
    structured_outputs,
)

MODEL = ModelLimits(name="m", max_model_len=100, vocab_size=50, max_logprobs=5,
                    generation_defaults={"temperature": 0.6, "top_p": 0.9, "max_tokens": 7})
LIMITS = RequestLimits(max_n=4, max_stop_sequences=2, max_stop_length=8, max_logit_bias=3)


def completion(**fields):
    return CompletionRequest.model_validate({"prompt": "hi", **fields})


def params_for(request, **kwargs):
    defaults = dict(max_tokens=request.max_tokens, logprobs=None, stream=request.stream)
    return build_sampling_params(request, LIMITS, MODEL, **{**defaults, **kwargs})


def api_error(function, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as caught:
        function(*args, **kwargs)
    return caught.value


def test_generation_config_defaults_apply_and_request_values_win():
    params = params_for(completion())
    assert (params.temperature, params.top_p, params.max_tokens) == (0.6, 0.9, 16)  # max_tokens: the request's 16
    params = params_for(completion(temperature=0, top_p=0.5, max_tokens=3))
    assert (params.temperature, params.top_p, params.max_tokens) == (0.0, 0.5, 3)


def test_every_extra_sampling_field_reaches_sampling_params():
    request = completion(top_k=5, min_p=0.1, repetition_penalty=1.2, min_tokens=2, ignore_eos=True,
                         stop_token_ids=[3, 4], skip_special_tokens=False, spaces_between_special_tokens=False,
                         include_stop_str_in_output=True, allowed_token_ids=[1, 2, 3], bad_words=["x"],
                         prompt_logprobs=2, seed=-7, presence_penalty=0.5, frequency_penalty=-0.5, n=2,
                         stop=["a", "bc"], logit_bias={"3": 500, "4": -1.5})
    params = params_for(request, logprobs=1)
    assert (params.top_k, params.min_p, params.repetition_penalty, params.min_tokens) == (5, 0.1, 1.2, 2)
    assert params.ignore_eos and params.include_stop_str_in_output
    assert not params.skip_special_tokens and not params.spaces_between_special_tokens
    assert params.stop_token_ids == [3, 4] and params.allowed_token_ids == [1, 2, 3] and params.bad_words == ["x"]
    assert (params.prompt_logprobs, params.logprobs, params.seed, params.n) == (2, 1, -7, 2)
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)
    assert params.stop == ["a", "bc"]
    assert params.logit_bias == {3: 100.0, 4: -1.5}  # clamped to [-100, 100]


def test_output_kind_follows_streaming_and_top_k_minus_one_disables():
    assert params_for(completion(stream=True)).output_kind == RequestOutputKind.DELTA
    assert params_for(completion()).output_kind == RequestOutputKind.FINAL_ONLY
    assert params_for(completion(top_k=-1)).top_k == 0


@pytest.mark.parametrize("fields, param", [
    ({"temperature": -1}, "temperature"), ({"temperature": 5}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"top_k": 1.5}, "top_k"), ({"min_p": 2}, "min_p"), ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -5}, "frequency_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"n": 0}, "n"), ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": 2**63}, "max_tokens"),
    ({"seed": 2**64}, "seed"), ({"logprobs": -1}, "logprobs"), ({"cache_salt": ""}, "cache_salt"),
    ({"model": 123}, "model"), ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"min_tokens": -1}, "min_tokens"),
])
def test_schema_bounds_reject(fields, param):
    with pytest.raises(ValidationError) as caught:
        completion(**fields)
    assert caught.value.errors()[0]["loc"][0] == param


def test_lax_integers_are_accepted_like_vllm():
    assert completion(max_tokens="10").max_tokens == 10


def test_caps_and_unsupported_fields():
    assert api_error(check_common, completion(n=5), LIMITS, MODEL).param == "n"
    assert api_error(check_common, completion(stop=["a", "b", "c"]), LIMITS, MODEL).param == "stop"
    assert api_error(check_common, completion(stop=""), LIMITS, MODEL).param == "stop"
    assert api_error(check_common, completion(stop=["123456789"]), LIMITS, MODEL).param == "stop"
    assert api_error(check_common, completion(logit_bias={"1": 1, "2": 1, "3": 1, "4": 1}), LIMITS, MODEL).param == "logit_bias"
    assert api_error(check_common, completion(logit_bias={"abc": 1}), LIMITS, MODEL).param == "logit_bias"
    assert api_error(check_common, completion(stream_options={"include_usage": True}), LIMITS, MODEL).param == "stream_options"
    assert api_error(check_common, completion(stream=True, prompt_logprobs=1), LIMITS, MODEL).param == "prompt_logprobs"
    assert api_error(check_common, completion(prompt_logprobs=6), LIMITS, MODEL).param == "prompt_logprobs"
    assert api_error(check_common, completion(priority=5), LIMITS, MODEL).param == "priority"
    assert api_error(check_common, completion(bad_words=[""]), LIMITS, MODEL).param == "bad_words"
    for field in ("logits_processors", "guided_json", "use_beam_search", "prompt_embeds"):
        error = api_error(check_common, completion(**{field: ["x"]}), LIMITS, MODEL)
        assert (error.status, error.param, error.code) == (400, field, "unsupported_parameter")
        assert "not supported" in error.message
    check_common(completion(foo=1, priority=0), LIMITS, MODEL)  # unknown fields are accepted
    priority_model = ModelLimits(name="m", max_model_len=100, vocab_size=50, max_logprobs=5, scheduling_policy="priority")
    check_common(completion(priority=5), LIMITS, priority_model)


def test_stop_strings_and_logit_bias_helpers():
    assert stop_strings("ab", LIMITS) == ["ab"] and stop_strings(None, LIMITS) == []
    assert logit_bias({"7": -1e30}, LIMITS) == {7: -100.0}
    assert logit_bias(None, LIMITS) is None
    assert api_error(logit_bias, {"-3": 1}, LIMITS).param == "logit_bias"


def test_invalid_combinations_from_sampling_params_become_400():
    error = api_error(params_for, completion(min_tokens=20, max_tokens=3))
    assert error.status == 400 and "min_tokens" in error.message
    error = api_error(params_for, completion(allowed_token_ids=[]))
    assert error.status == 400


def test_model_check_and_context_length():
    assert check_model(None, MODEL) == "m" and check_model("m", MODEL) == "m"
    error = api_error(check_model, "other", MODEL)
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert error.message == "The model `other` does not exist."
    error = api_error(check_context, 100, None, MODEL)
    assert error.code == "context_length_exceeded" and "100" in error.message
    error = api_error(check_context, 60, 50, MODEL)
    assert "100 tokens" in error.message and "60 in the input" in error.message and "50 for the completion" in error.message
    check_context(60, 40, MODEL)
    check_context(99, None, MODEL)


def test_completion_prompt_forms():
    assert CompletionRequest(prompt="a").prompts() == ["a"]
    assert CompletionRequest(prompt=["a", "b"]).prompts() == ["a", "b"]
    assert CompletionRequest(prompt=[1, 2]).prompts() == [[1, 2]]
    assert CompletionRequest(prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]


def test_chat_and_messages_models():
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                                                 "max_completion_tokens": 3})
    assert chat.output_limit() == 3
    for bad in ({"messages": []}, {"messages": [{"content": "x"}]}, {"messages": [{"role": "hacker", "content": "x"}]},
                {"messages": [{"role": "user", "content": 5}]}, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
                {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}):
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate(bad)
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate({"messages": [{"role": "user", "content": "x"}]})  # no max_tokens
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})


def test_structured_outputs_from_either_field():
    from tokenmill.structured import StructuredOutputsParams

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert structured_outputs(completion(), None) is None
    assert structured_outputs(completion(), {"type": "text"}) is None
    assert structured_outputs(completion(), {"type": "json_object"}) == StructuredOutputsParams(json_object=True)
    found = structured_outputs(completion(), {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert found == StructuredOutputsParams(json=schema)
    assert structured_outputs(completion(structured_outputs={"choice": ["a", "b"]}), None).choice == ["a", "b"]
    assert structured_outputs(completion(structured_outputs={"json": schema}), None).json == schema
    params = params_for(completion(), constraint=StructuredOutputsParams(regex="[ab]+"))
    assert params.structured_outputs.regex == "[ab]+"


@pytest.mark.parametrize("fields, response_format, param", [
    ({"structured_outputs": {"regex": "a("}}, None, "structured_outputs"),
    ({"structured_outputs": {"json": {"type": 5}}}, None, "structured_outputs"),
    ({"structured_outputs": {"choice": ["a"]}}, {"type": "json_object"}, "response_format"),
    ({}, {"type": "json_schema"}, "response_format"),
    ({}, {"type": "json_schema", "json_schema": "x"}, "response_format"),
    ({}, {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}, "response_format"),
    ({}, {"type": "structural_tag"}, "response_format"),
    ({}, {"type": ["x"]}, "response_format"),
])
def test_bad_structured_outputs_are_400(fields, response_format, param):
    error = api_error(structured_outputs, completion(**fields), response_format)
    assert (error.status, error.param) == (400, param), error.message


def test_structured_outputs_fields_are_bounded_and_unknown_ones_refused():
    for bad in ({"choice": []}, {"regex": ""}, {"regex": "a" * 70000}, {"choice": ["a"] * 1025},
                {"json": {}, "whitespace_pattern": " "}, ["x"]):
        with pytest.raises(ValidationError):
            completion(structured_outputs=bad)


def test_structural_tag_from_response_format_or_field():
    import json

    structures = [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}]
    legacy = structured_outputs(completion(), {"type": "structural_tag", "structures": structures, "triggers": ["<f"]})
    assert json.loads(legacy.structural_tag) == {"structures": structures, "triggers": ["<f"]}
    fmt = {"type": "tag", "begin": "<n>", "content": {"type": "regex", "pattern": "[0-9]+"}, "end": "</n>"}
    current = structured_outputs(completion(), {"type": "structural_tag", "format": fmt})
    assert json.loads(current.structural_tag) == {"type": "structural_tag", "format": fmt}
    text = json.dumps({"type": "structural_tag", "format": fmt})
    assert structured_outputs(completion(structured_outputs={"structural_tag": text}), None).structural_tag == text
    error = api_error(structured_outputs, completion(), {"type": "structural_tag", "format": {"type": "x"}})
    assert error.param == "response_format" and "Format type not recognized" in error.message


def test_messages_keep_special_tokens_for_a_parser_that_reads_them():
    from tokenmill_server.serving_messages import _sampling_params
    from tokenmill_server.tool_choice import ToolChoice

    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    state = SimpleNamespace(model=MODEL, limits=LIMITS)
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    assert _sampling_params(body, state, None).skip_special_tokens
    assert _sampling_params(body, state, ToolChoice.from_anthropic(tools, None, "hermes")).skip_special_tokens
    assert not _sampling_params(body, state, ToolChoice.from_anthropic(tools, None, "mistral")).skip_special_tokens
