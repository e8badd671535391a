"""``POST /v1/completions``: tokenize each prompt, run them together, answer as JSON or as SSE."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams
from tokenmill.tokenizer import token_texts
from tokenmill_server.errors import ApiError, bad_request, context_length_exceeded, error_body, unsupported
from tokenmill_server.event_stream import DONE, EventStreamResponse, data_event
from tokenmill_server.generation import (
    ClientDisconnected,
    engine_errors,
    merge,
    new_request_id,
    until_disconnected,
)
from tokenmill_server.logprobs import CompletionLogprobs, prompt_logprobs_json
from tokenmill_server.protocol.completion import CompletionRequest
from tokenmill_server.sampling import (
    build_sampling_params,
    check_common,
    check_context,
    check_logprobs,
    check_model,
    check_token_ids,
    structured_outputs,
)
from tokenmill_server.state import ServerState, server_state
from tokenmill_server.usage import Usage

logger = logging.getLogger("tokenmill.server")
PATH = "/v1/completions"


def _check(body: CompletionRequest, state: ServerState) -> None:
    model, limits = state.model, state.limits
    check_common(body, limits, model)
    if body.suffix is not None:
        raise unsupported("suffix (fill-in-the-middle)", "suffix")
    check_logprobs(body.logprobs, model, "logprobs")
    if body.best_of is not None:
        if body.best_of < body.n:
            raise bad_request(f"best_of must be greater than or equal to n, got n={body.n} and best_of={body.best_of}.",
                              "best_of")
        if body.best_of > state.limits.max_n:
            raise bad_request(f"best_of must be at most {state.limits.max_n}, got {body.best_of}.", "best_of")
        if body.stream and body.best_of > body.n:
            raise bad_request("best_of cannot be used with stream.", "best_of")
    if body.max_tokens == 0 and not body.echo:
        raise bad_request("max_tokens must be at least 1 (0 is allowed only with echo, to score the prompt).",
                          "max_tokens")


async def _tokenize(state: ServerState, prompt: str | list[int], body: CompletionRequest) -> tuple[str, list[int]]:
    engine, bounds = state.engine, state.prompt_bounds
    keep_end = body.truncate_prompt_tokens is not None
    if isinstance(prompt, str):
        text = prompt
        if keep_end:  # only the prompt's end is kept: a longer start is never tokenized
            ids = await bounds.encode_end(engine, prompt, "prompt", add_special_tokens=body.add_special_tokens)
        else:
            ids = await bounds.encode(engine, prompt, "prompt", add_special_tokens=body.add_special_tokens)
    else:
        ids = list(prompt)
        if not keep_end and len(ids) >= state.model.max_model_len:
            raise context_length_exceeded(state.model.max_model_len, len(ids), None)
        bad = next((t for t in ids if t >= state.model.vocab_size), None)
        if bad is not None:
            raise bad_request(f"Token id {bad} is out of vocabulary (the vocabulary has {state.model.vocab_size} "
                              f"tokens).", "prompt")
        text = await engine.run_tokenizer(engine.tokenizer.decode, ids) if body.echo else ""
    if not ids:
        raise bad_request("The prompt cannot be empty.", "prompt")
    if body.truncate_prompt_tokens is not None:
        keep = state.model.max_model_len - 1 if body.truncate_prompt_tokens == -1 else body.truncate_prompt_tokens
        ids = ids[-keep:] if keep > 0 else ids
    return text, ids


async def create_completion(body: CompletionRequest, http: Request) -> Response:
    state = server_state(http)
    state.check_accepting()
    check_model(body.model, state.model)
    _check(body, state)
    prompts = body.prompts()
    if not prompts:
        raise bad_request("The prompt cannot be empty.", "prompt")
    if len(prompts) > state.limits.max_prompts:
        raise bad_request(f"At most {state.limits.max_prompts} prompts are allowed per request, got {len(prompts)}.",
                          "prompt")
    with state.admission(len(prompts) * (body.best_of or body.n)):
        tokenized = [await _tokenize(state, prompt, body) for prompt in prompts]
    score_only = body.max_tokens == 0
    for _, ids in tokenized:
        check_context(len(ids), None if score_only else body.max_tokens, state.model)
    params = build_sampling_params(body, state.limits, state.model, max_tokens=1 if score_only else body.max_tokens,
                                   logprobs=body.logprobs, stream=body.stream, best_of=body.best_of,
                                   constraint=structured_outputs(body, body.response_format))
    if body.echo and body.logprobs is not None:
        params = params.clone(prompt_logprobs=max(body.logprobs, params.prompt_logprobs or 0))
    check_token_ids(params, state.model)
    view = _CompletionView(body, state.model.name, tokenized, params, score_only)
    if body.echo and body.logprobs is not None:
        engine = state.engine
        view.prompt_token_texts = [await engine.run_tokenizer(token_texts, engine.tokenizer, ids) for _, ids in tokenized]
    request_ids, streams = [], []
    with engine_errors(state.metrics):
        try:
            for index, (text, ids) in enumerate(tokenized):
                request_ids.append(f"{view.id}-{index}")
                streams.append(state.engine.add_request(request_ids[-1], ids, params, prompt_text=text,
                                                        priority=body.priority, cache_salt=body.cache_salt))
        except BaseException:
            _abort(state, request_ids)
            raise
    if body.stream:
        return EventStreamResponse(view.stream(streams), on_close=lambda: _abort(state, request_ids),
                                   budget=state.stream_budget(PATH))
    try:
        outputs = await until_disconnected(http, _collect(streams, state))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        _abort(state, request_ids)
    return JSONResponse(view.response(outputs))


def _abort(state: ServerState, request_ids: list[str]) -> None:
    for request_id in request_ids:
        state.engine.abort(request_id)


async def _collect(streams: list, state: ServerState) -> list[RequestOutput]:
    results: list[Any] = [None] * len(streams)
    with engine_errors(state.metrics):
        async for index, output in merge(streams):
            results[index] = output
    return results


class _CompletionView:
    """Formats one completion request's outputs (JSON body or SSE chunks)."""

    def __init__(self, body: CompletionRequest, model: str, prompts: list[tuple[str, list[int]]],
                 params: SamplingParams, score_only: bool) -> None:
        self.body = body
        self.model = model
        self.prompts = prompts
        self.n = params.n
        self.score_only = score_only
        self.id = new_request_id("cmpl")
        self.created = int(time.time())
        self.prompt_token_texts: list[list[str] | None] = [None] * len(prompts)

    def _choice(self, prompt_index: int, output: RequestOutput, completion: Any, builder: CompletionLogprobs | None,
                first: bool) -> dict[str, Any]:
        body = self.body
        prompt_text, prompt_ids = self.prompts[prompt_index]
        text, token_ids, positions = completion.text, completion.token_ids, completion.logprobs
        if self.score_only:
            text, token_ids, positions = "", [], []
        logprobs = None
        if builder is not None:
            parts = []
            if body.echo and first:
                parts.append(builder.build(prompt_ids, output.prompt_logprobs or [None] * len(prompt_ids),
                                           self.prompt_token_texts[prompt_index]))
            parts.append(builder.build(token_ids, positions or []))
            logprobs = {key: [v for part in parts for v in part[key]] for key in parts[0]}
        if body.echo and first:
            text = prompt_text + text
        choice = {"index": prompt_index * self.n + completion.index, "text": text, "logprobs": logprobs,
                  "finish_reason": "length" if self.score_only and completion.finish_reason else
                  completion.finish_reason, "stop_reason": completion.stop_reason}
        if body.prompt_logprobs is not None and first:
            choice["prompt_logprobs"] = prompt_logprobs_json(output.prompt_logprobs)
        return choice

    def _builder(self) -> CompletionLogprobs | None:
        if self.body.logprobs is None:
            return None
        return CompletionLogprobs(self.body.logprobs, self.body.return_tokens_as_token_ids)

    def response(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        usage = Usage()
        choices = []
        for prompt_index, output in enumerate(outputs):
            usage.add_prompt(len(self.prompts[prompt_index][1]), output.num_cached_tokens or 0)
            for completion in output.outputs:
                choices.append(self._choice(prompt_index, output, completion, self._builder(), True))
                usage.completion_tokens += 0 if self.score_only else len(completion.token_ids)
        choices.sort(key=lambda c: c["index"])
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices, "usage": usage.as_dict()}

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        chunk = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                 "choices": choices}
        options = self.body.stream_options
        if options is not None and options.include_usage:
            chunk["usage"] = usage if options.continuous_usage_stats else None
        return chunk

    async def stream(self, streams: list):
        usage = Usage()
        builders: dict[int, CompletionLogprobs | None] = {}
        started: set[int] = set()
        try:
            with engine_errors():
                async for prompt_index, output in merge(streams):
                    if prompt_index not in started:
                        started.add(prompt_index)
                        usage.add_prompt(len(self.prompts[prompt_index][1]), output.num_cached_tokens or 0)
                    choices = []
                    for completion in output.outputs:
                        index = prompt_index * self.n + completion.index
                        first = index not in builders
                        builder = builders.setdefault(index, self._builder())
                        choices.append(self._choice(prompt_index, output, completion, builder, first))
                        usage.completion_tokens += 0 if self.score_only else len(completion.token_ids)
                    yield data_event(self._chunk(choices, usage.as_dict()))
            options = self.body.stream_options
            if options is not None and options.include_usage:
                yield data_event({"id": self.id, "object": "text_completion", "created": self.created,
                                  "model": self.model, "choices": [], "usage": usage.as_dict()})
        except ApiError as error:
            yield data_event(error_body(error, PATH))
        except Exception:
            logger.exception("completion stream failed")
            yield data_event(error_body(ApiError(500, "Internal server error."), PATH))
        yield DONE
