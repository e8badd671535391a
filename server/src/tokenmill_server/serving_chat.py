"""``POST /v1/chat/completions``: render the conversation with the chat template, run it, answer as
a ``chat.completion`` or as ``chat.completion.chunk`` events."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.outputs import CompletionOutput, RequestOutput
from tokenmill_server.conversation import openai_conversation, template_options
from tokenmill_server.errors import ApiError, bad_request, error_body
from tokenmill_server.event_stream import DONE, EventStreamResponse, data_event
from tokenmill_server.generation import (
    ClientDisconnected,
    engine_errors,
    final_output,
    new_request_id,
    until_disconnected,
)
from tokenmill_server.logprobs import chat_logprobs, prompt_logprobs_json
from tokenmill_server.protocol.chat import ChatCompletionRequest
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
from tokenmill_server.tool_choice import ToolChoice
from tokenmill_server.usage import Usage

logger = logging.getLogger("tokenmill.server")
PATH = "/v1/chat/completions"


def _check_features(body: ChatCompletionRequest, state: ServerState) -> ToolChoice | None:
    """400s for what the request cannot have; returns the tool call it forces, if any."""
    check_common(body, state.limits, state.model)
    tools, choice = body.tools or [], body.tool_choice
    if len(tools) > state.limits.max_tools:
        raise bad_request(f"At most {state.limits.max_tools} tools are allowed, got {len(tools)}.", "tools")
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or a named function.", "tool_choice")
    if choice is not None and choice != "none" and not tools:
        raise bad_request("tool_choice needs tools.", "tool_choice")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs to be true.", "top_logprobs")
    check_logprobs(body.top_logprobs, state.model, "top_logprobs")
    tool = ToolChoice.from_request(tools, choice, body.parallel_tool_calls, state.limits.tool_call_parser)
    if tool is not None and tool.forced and (body.structured_outputs is not None or
                             (body.response_format is not None and body.response_format.type != "text")):
        raise bad_request("A forced tool call already fixes the output's format: drop response_format and "
                          "structured_outputs, or tool_choice.", "tool_choice")
    return tool


async def create_chat_completion(body: ChatCompletionRequest, http: Request) -> Response:
    state = server_state(http)
    state.check_accepting()
    name = check_model(body.model, state.model)
    tool = _check_features(body, state)
    options = template_options(body.chat_template, body.chat_template_kwargs, body.add_generation_prompt,
                               body.continue_final_message, state.limits)
    if body.documents is not None:
        options["documents"] = body.documents  # for templates with retrieval documents
    if body.reasoning_effort is not None:
        options["reasoning_effort"] = body.reasoning_effort  # a template variable, as in vLLM
    if tool is not None:
        options["tools"] = body.tools  # the template shows the model what it may call
    engine = state.engine
    conversation = openai_conversation(body.messages)
    bounds = state.prompt_bounds
    bounds.check_conversation(conversation, options)
    with state.admission(body.n):
        text, ids = await state.render_chat(conversation, options)
        if body.add_special_tokens:
            ids = await bounds.encode(engine, text, "messages")
    max_tokens = body.output_limit()
    check_context(len(ids), max_tokens, state.model)
    default_limit = state.model.generation_defaults.get("max_tokens")
    if max_tokens is None and default_limit is not None:
        max_tokens = min(int(default_limit), state.model.max_model_len - len(ids))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    response_format = body.response_format.model_dump() if body.response_format is not None else None
    constraint = tool.constraint if tool is not None and tool.forced else structured_outputs(body, response_format)
    params = build_sampling_params(body, state.limits, state.model, max_tokens=max_tokens, logprobs=logprobs,
                                   stream=body.stream, constraint=constraint)
    if tool is not None and tool.keeps_special_tokens:
        params.skip_special_tokens = False
    check_token_ids(params, state.model)
    echo = conversation[-1]["content"] if body.echo and conversation[-1]["role"] == "assistant" else ""
    view = _ChatView(body, name, len(ids), echo, tool)
    with engine_errors(state.metrics):
        stream = engine.add_request(view.id, ids, params, prompt_text=text, priority=body.priority,
                                    cache_salt=body.cache_salt)
    if body.stream:
        return EventStreamResponse(view.stream(stream), on_close=lambda: engine.abort(view.id),
                                   budget=state.stream_budget(PATH))
    try:
        with engine_errors():
            output = await until_disconnected(http, final_output(stream))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        engine.abort(view.id)
    return JSONResponse(view.response(output))


class _ChatView:
    """Formats one chat request's output (JSON body or SSE chunks)."""

    def __init__(self, body: ChatCompletionRequest, model: str, num_prompt_tokens: int, echo: str,
                 tool: ToolChoice | None = None) -> None:
        self.body = body
        self.tool = tool
        self.model = model
        self.num_prompt_tokens = num_prompt_tokens
        self.echo = echo
        self.id = new_request_id("chatcmpl")
        self.created = int(time.time())

    def _logprobs(self, completion: CompletionOutput) -> dict[str, Any] | None:
        if not self.body.logprobs or completion.logprobs is None:
            return None
        return chat_logprobs(completion.token_ids, completion.logprobs, self.body.top_logprobs or 0,
                             self.body.return_tokens_as_token_ids)

    def response(self, output: RequestOutput) -> dict[str, Any]:
        usage = Usage()
        usage.add_prompt(self.num_prompt_tokens, output.num_cached_tokens or 0)
        choices = []
        for completion in output.outputs:
            usage.completion_tokens += len(completion.token_ids)
            message: dict[str, Any] = {"role": "assistant", "content": self.echo + completion.text, "tool_calls": []}
            finish_reason = completion.finish_reason
            content, calls = self.tool.parse(completion.text) if self.tool is not None else (None, [])
            if calls:
                message.update(content=self.echo + content if content else self.echo or None, tool_calls=calls)
                finish_reason = self.tool.finish_reason if finish_reason == "stop" else finish_reason
            choices.append({"index": completion.index, "message": message, "logprobs": self._logprobs(completion),
                            "finish_reason": finish_reason, "stop_reason": completion.stop_reason})
        body = {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": choices, "usage": usage.as_dict()}
        if self.body.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(output.prompt_logprobs)
        return body

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage) -> bytes:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": choices}
        options = self.body.stream_options
        if options is not None and options.include_usage:
            chunk["usage"] = usage.as_dict() if options.continuous_usage_stats else None
        return data_event(chunk)

    async def stream(self, outputs):
        usage = Usage()
        usage.prompt_tokens = self.num_prompt_tokens
        try:
            yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None} for i in range(self.body.n)], usage)
            echoed: set[int] = set()
            calls = _StreamedCalls(self.tool)
            with engine_errors():
                async for output in outputs:
                    usage.cached_tokens = output.num_cached_tokens or 0
                    choices = []
                    for completion in output.outputs:
                        usage.completion_tokens += len(completion.token_ids)
                        text = completion.text
                        if self.echo and completion.index not in echoed:
                            echoed.add(completion.index)
                            text = self.echo + text
                        logprobs = self._logprobs(completion)
                        delta, finish_reason = calls.delta(completion, text)
                        if not delta and finish_reason is None and not logprobs:
                            continue
                        choice = {"index": completion.index, "delta": delta, "logprobs": logprobs,
                                  "finish_reason": finish_reason}
                        if completion.finish_reason is not None:
                            choice["stop_reason"] = completion.stop_reason
                        choices.append(choice)
                    if choices:
                        yield self._chunk(choices, usage)
            options = self.body.stream_options
            if options is not None and options.include_usage:
                yield data_event({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                  "model": self.model, "choices": [], "usage": usage.as_dict()})
        except ApiError as error:
            yield data_event(error_body(error, PATH))
        except Exception:
            logger.exception("chat stream failed")
            yield data_event(error_body(ApiError(500, "Internal server error."), PATH))
        yield DONE


class _StreamedCalls:
    """Chunk deltas of a streamed choice: its text, or the tool calls a forced call makes of it (a named
    call's arguments as they come; the calls of "required" whole, when the output ends); an "auto"
    answer streams as content up to where a call may begin, and its calls come whole at the end."""

    def __init__(self, tool: ToolChoice | None) -> None:
        self.tool = tool
        self._text: dict[int, str] = {}
        self._named_started: set[int] = set()
        self._content_sent: dict[int, int] = {}

    def delta(self, completion: CompletionOutput, text: str) -> tuple[dict[str, Any], str | None]:
        finish_reason = completion.finish_reason
        if self.tool is None:
            return ({"content": text} if text else {}), finish_reason
        index = completion.index
        self._text[index] = self._text.get(index, "") + text
        if self.tool.named is None:  # "required" or "auto": the calls are known at the end
            return self._calls_at_end(index, finish_reason)
        if finish_reason == "stop":
            finish_reason = self.tool.finish_reason
        if not text:
            return {}, finish_reason
        if index in self._named_started:
            piece = {"index": 0, "function": {"arguments": text}}
        else:
            self._named_started.add(index)
            piece = self.tool.first_delta(text)
        return {"tool_calls": [piece]}, finish_reason

    def _calls_at_end(self, index: int, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """Content as far as it surely is content ("auto" only: a forced call has none), then the calls
        whole; an output that made no call (or was cut short before its JSON closed) ends as content."""
        whole, sent = self._text[index], self._content_sent.get(index, 0)
        if finish_reason is None:
            end = self.tool.content_end(whole)
            if end <= sent:
                return {}, None
            self._content_sent[index] = end
            return {"content": whole[sent:end]}, None
        _, calls = self.tool.parse(whole)
        if not calls:
            return ({"content": whole[sent:]} if whole[sent:] else {}), finish_reason
        return ({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]},
                self.tool.finish_reason if finish_reason == "stop" else finish_reason)
