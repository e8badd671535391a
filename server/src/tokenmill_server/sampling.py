"""From validated request models to SamplingParams: the server's caps (n, stop strings, logit_bias,
logprobs, prompts), features that do not exist yet (a clear 400, never silently ignored), and the
context-length check. Pure functions: unit-testable without a model."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.structured import StructuredOutputsParams
from tokenmill_server.errors import ApiError, bad_request, context_length_exceeded, model_not_found, unsupported
from tokenmill_server.protocol.common import SamplingFields

logger = logging.getLogger("tokenmill.server")

# request fields that name features this server does not have (vLLM's removed guided_* among them)
UNSUPPORTED_FIELDS = {
    "guided_json": "guided decoding (guided_json)", "guided_regex": "guided decoding (guided_regex)",
    "guided_choice": "guided decoding (guided_choice)", "guided_grammar": "guided decoding (guided_grammar)",
    "guided_decoding_backend": "guided decoding", "use_beam_search": "beam search", "length_penalty": "beam search",
    "prompt_embeds": "prompt embeddings", "kv_transfer_params": "KV transfer", "mm_processor_kwargs": "multimodal input",
    "functions": "function calling", "function_call": "function calling", "audio": "audio output",
    "modalities": "output modalities other than text", "prediction": "predicted outputs",
}


@dataclass(frozen=True)
class RequestLimits:
    """Caps set by the server's flags."""

    max_n: int = 64
    max_stop_sequences: int = 16
    max_stop_length: int = 1024
    max_logit_bias: int = 1024
    max_bad_words: int = 256
    max_prompts: int = 64
    max_embedding_inputs: int = 2048
    max_tools: int = 128
    tool_call_parser: str | None = None  # set: tool_choice "auto" is served, reading calls with this parser
    trust_request_chat_template: bool = False


@dataclass(frozen=True)
class ModelLimits:
    """What the loaded model allows (from the engine's READY message)."""

    name: str
    max_model_len: int
    vocab_size: int
    max_logprobs: int
    scheduling_policy: str = "fcfs"
    generation_defaults: Mapping[str, Any] = field(default_factory=dict)


def check_model(requested: str | None, model: ModelLimits) -> str:
    """The served name, or 404 for a model this server does not serve (omitted means the default)."""
    if requested is not None and requested != model.name:
        raise model_not_found(requested)
    return model.name


def stop_strings(value: str | list[str] | None, limits: RequestLimits, param: str = "stop") -> list[str]:
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > limits.max_stop_sequences:
        raise bad_request(f"At most {limits.max_stop_sequences} stop sequences are allowed, got {len(stops)}.", param)
    for stop in stops:
        if not stop:
            raise bad_request("Stop sequences must be non-empty strings.", param)
        if len(stop) > limits.max_stop_length:
            raise bad_request(f"Stop sequences may be at most {limits.max_stop_length} characters long.", param)
    return stops


def logit_bias(value: Mapping[str, float] | None, limits: RequestLimits) -> dict[int, float] | None:
    """Token-id keys as ints, biases clamped to [-100, 100] like OpenAI and vLLM."""
    if not value:
        return None
    if len(value) > limits.max_logit_bias:
        raise bad_request(f"logit_bias may hold at most {limits.max_logit_bias} entries, got {len(value)}.", "logit_bias")
    bias = {}
    for key, amount in value.items():
        try:
            token_id = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids (integers), got {key[:50]!r}.", "logit_bias") from None
        if token_id < 0:
            raise bad_request(f"logit_bias keys must be non-negative token ids, got {token_id}.", "logit_bias")
        bias[token_id] = max(-100.0, min(100.0, amount))
    return bias


def check_common(request: SamplingFields, limits: RequestLimits, model: ModelLimits) -> None:
    """Checks shared by both OpenAI endpoints, before any tokenization."""
    ignored = request.ignored_fields()
    for name in ignored:
        if name in UNSUPPORTED_FIELDS:
            raise unsupported(UNSUPPORTED_FIELDS[name].capitalize(), name)
    if ignored:
        logger.warning("request fields ignored (not part of this API): %s", ", ".join(n[:40] for n in ignored[:10]))
    if request.logits_processors is not None:
        raise unsupported("Per-request logits_processors", "logits_processors")
    if request.n > limits.max_n:
        raise bad_request(f"n must be at most {limits.max_n}, got {request.n}.", "n")
    if request.stream_options is not None and not request.stream:
        raise bad_request("stream_options is only allowed when stream is true.", "stream_options")
    if request.prompt_logprobs is not None:
        if request.stream:
            raise bad_request("prompt_logprobs is not available when streaming.", "prompt_logprobs")
        if request.prompt_logprobs > model.max_logprobs:
            raise bad_request(f"prompt_logprobs must be at most {model.max_logprobs}, got {request.prompt_logprobs}.",
                              "prompt_logprobs")
    if request.priority != 0 and model.scheduling_policy != "priority":
        raise bad_request("priority is only supported when the server runs with --scheduling-policy priority.",
                          "priority")
    if request.bad_words is not None:
        if len(request.bad_words) > limits.max_bad_words:
            raise bad_request(f"At most {limits.max_bad_words} bad_words are allowed.", "bad_words")
        if not all(request.bad_words):
            raise bad_request("bad_words must be non-empty strings.", "bad_words")
        if any(len(word) > limits.max_stop_length for word in request.bad_words):
            raise bad_request(f"bad_words may be at most {limits.max_stop_length} characters long.", "bad_words")
    stop_strings(request.stop, limits)
    logit_bias(request.logit_bias, limits)
    for name in ("stop_token_ids", "allowed_token_ids"):
        token_ids(getattr(request, name), model, name)


def token_ids(value: list[int] | None, model: ModelLimits, param: str) -> None:
    """400 for a list of token ids longer than the vocabulary or naming an id outside it."""
    if value is None:
        return
    if len(value) > model.vocab_size:
        raise bad_request(f"{param} may hold at most {model.vocab_size} ids (the vocabulary's size), got {len(value)}.",
                          param)
    bad = next((t for t in value if not 0 <= t < model.vocab_size), None)
    if bad is not None:
        raise bad_request(f"{param} holds token id {bad}, outside the vocabulary [0, {model.vocab_size}).", param)


def check_logprobs(value: int | None, model: ModelLimits, param: str) -> None:
    if value is not None and value > model.max_logprobs:
        raise bad_request(f"{param} must be at most {model.max_logprobs}, got {value}.", param)


def check_context(num_prompt_tokens: int, max_tokens: int | None, model: ModelLimits) -> None:
    """400 context_length_exceeded when the prompt (plus max_tokens) does not fit the model."""
    if num_prompt_tokens >= model.max_model_len:
        raise context_length_exceeded(model.max_model_len, num_prompt_tokens, None)
    if max_tokens is not None and num_prompt_tokens + max_tokens > model.max_model_len:
        raise context_length_exceeded(model.max_model_len, num_prompt_tokens, max_tokens)


def structured_outputs(request: SamplingFields, response_format: Mapping[str, Any] | None) -> StructuredOutputsParams | None:
    """The request's output constraint, from vLLM's ``structured_outputs`` or OpenAI's ``response_format``
    (``json_object``, ``json_schema`` with its ``schema``, or ``structural_tag``); 400 for both at once, a
    malformed schema, regex, grammar or tag, or a response format this server cannot follow."""
    response_format = response_format if isinstance(response_format, Mapping) else {}
    kind = response_format.get("type", "text")
    if request.structured_outputs is not None:
        if kind != "text":
            raise bad_request("Give either structured_outputs or response_format, not both.", "response_format")
        fields = request.structured_outputs.model_dump(by_alias=True, exclude_none=True)
        param = "structured_outputs"
    elif kind == "json_object":
        fields, param = {"json_object": True}, "response_format"
    elif kind == "json_schema":
        described = response_format.get("json_schema")
        schema = described.get("schema") if isinstance(described, Mapping) else None
        if not isinstance(schema, (dict, bool)):
            raise bad_request("response_format json_schema needs json_schema.schema, a JSON schema object.",
                              "response_format")
        if schema is False:
            raise bad_request("response_format json_schema.schema is false, which no output can satisfy.",
                              "response_format")
        fields, param = {"json": schema if isinstance(schema, dict) else {}}, "response_format"
    elif kind == "structural_tag":
        if "format" in response_format:
            tag: dict[str, Any] = {"type": "structural_tag", "format": response_format["format"]}
        elif "structures" in response_format:
            tag = {"structures": response_format["structures"], "triggers": response_format.get("triggers", [])}
        else:
            raise bad_request("response_format structural_tag needs format (or structures and triggers).",
                              "response_format")
        fields, param = {"structural_tag": json.dumps(tag)}, "response_format"
    elif kind == "text":
        return None
    else:
        raise unsupported(f"Structured output (response_format {str(kind)[:40]})", "response_format")
    try:
        constraint = StructuredOutputsParams(**fields)
        constraint.check_grammar()
    except ValueError as error:
        raise bad_request(str(error), param) from None
    return constraint


def build_sampling_params(request: SamplingFields, limits: RequestLimits, model: ModelLimits, *,
                          max_tokens: int | None, logprobs: int | None, stream: bool,
                          best_of: int | None = None, stop: list[str] | None = None,
                          constraint: StructuredOutputsParams | None = None) -> SamplingParams:
    """SamplingParams from the request, over the model's generation defaults; ValueError -> 400."""
    values: dict[str, Any] = {k: v for k, v in model.generation_defaults.items() if k != "max_tokens"}
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        if getattr(request, name) is not None:
            values[name] = getattr(request, name)
    values.update(
        n=request.n, best_of=best_of, presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty, seed=request.seed,
        stop=stop if stop is not None else stop_strings(request.stop, limits),
        stop_token_ids=list(request.stop_token_ids or []), bad_words=list(request.bad_words or []),
        include_stop_str_in_output=request.include_stop_str_in_output, ignore_eos=request.ignore_eos,
        max_tokens=max_tokens, min_tokens=request.min_tokens, logprobs=logprobs,
        prompt_logprobs=request.prompt_logprobs, skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        logit_bias=logit_bias(request.logit_bias, limits), allowed_token_ids=request.allowed_token_ids,
        structured_outputs=constraint, output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
    if values.get("top_k") == -1:
        values["top_k"] = 0
    try:
        return SamplingParams(**values)
    except (ValueError, TypeError) as error:
        raise bad_request(str(error)) from None


def check_token_ids(params: SamplingParams, model: ModelLimits) -> None:
    try:
        params.check_token_ids(model.vocab_size)
    except ValueError as error:
        raise ApiError(400, str(error)) from None
