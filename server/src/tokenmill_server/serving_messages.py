"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API, with its event
sequence when streaming (message_start, content_block_start, ping, content_block_delta...,
content_block_stop, message_delta, message_stop)."""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.outputs import CompletionOutput
from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill_server.conversation import anthropic_conversation
from tokenmill_server.errors import ApiError, bad_request, error_body, unsupported
from tokenmill_server.event_stream import EventStreamResponse, named_event
from tokenmill_server.generation import (
    ClientDisconnected,
    engine_errors,
    final_output,
    new_request_id,
    until_disconnected,
)
from tokenmill_server.protocol.anthropic import CountTokensRequest, MessagesRequest
from tokenmill_server.sampling import check_context, check_model, stop_strings
from tokenmill_server.state import ServerState, server_state
from tokenmill_server.tool_choice import ToolChoice

logger = logging.getLogger("tokenmill.server")
PATH = "/v1/messages"


def _check_features(body: CountTokensRequest, state: ServerState) -> ToolChoice | None:
    """400s for what the request cannot have; returns how its tools shape the output, if they do."""
    if body.thinking and body.thinking.get("type") not in (None, "disabled"):
        raise unsupported("Extended thinking", "thinking")
    return ToolChoice.from_anthropic(body.tools, body.tool_choice, state.limits.tool_call_parser)


async def _render(state: ServerState, body: CountTokensRequest, tool: ToolChoice | None) -> tuple[str, list[int]]:
    conversation = anthropic_conversation(body.system, body.messages)
    prefill = conversation[-1]["role"] == "assistant"  # continue the assistant's partial answer
    options: dict[str, Any] = {"add_generation_prompt": not prefill}
    if prefill:
        options["continue_final_message"] = True
    if tool is not None:
        options["tools"] = tool.openai_tools()
    state.prompt_bounds.check_conversation(conversation, options)
    with engine_errors():
        return await state.engine.render_chat(conversation, **options)


async def count_tokens(body: CountTokensRequest, http: Request) -> Response:
    state = server_state(http)
    state.check_accepting()
    check_model(body.model, state.model)
    _, ids = await _render(state, body, _check_features(body, state))
    return JSONResponse({"input_tokens": len(ids)})


def _sampling_params(body: MessagesRequest, state: ServerState, tool: ToolChoice | None) -> SamplingParams:
    values = {k: v for k, v in state.model.generation_defaults.items() if k != "max_tokens"}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            values[name] = getattr(body, name)
    values.update(max_tokens=body.max_tokens, stop=stop_strings(body.stop_sequences, state.limits, "stop_sequences"),
                  output_kind=RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY,
                  structured_outputs=tool.constraint if tool is not None else None,  # None for "auto"
                  skip_special_tokens=not (tool is not None and tool.keeps_special_tokens))
    try:
        return SamplingParams(**values)
    except ValueError as error:
        raise bad_request(str(error)) from None


def stop_reason(completion: CompletionOutput, tool_use: bool = False) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a finished completion."""
    if tool_use:
        return "tool_use", None
    if completion.finish_reason == "length":
        return "max_tokens", None
    if isinstance(completion.stop_reason, str):
        return "stop_sequence", completion.stop_reason
    return "end_turn", None


async def create_message(body: MessagesRequest, http: Request) -> Response:
    state = server_state(http)
    state.check_accepting()
    name = check_model(body.model, state.model)
    tool = _check_features(body, state)
    params = _sampling_params(body, state, tool)
    with state.admission(1):
        text, ids = await _render(state, body, tool)
    check_context(len(ids), body.max_tokens, state.model)
    message_id = new_request_id("msg").replace("-", "_")
    with engine_errors(state.metrics):
        stream = state.engine.add_request(message_id, ids, params, prompt_text=text)
    view = _MessageView(message_id, name, len(ids), tool)
    if body.stream:
        return EventStreamResponse(view.stream(stream), on_close=lambda: state.engine.abort(message_id),
                                   budget=state.stream_budget(PATH))
    try:
        with engine_errors():
            output = await until_disconnected(http, final_output(stream))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        state.engine.abort(message_id)
    completion = output.outputs[0]
    blocks = view.content_blocks(completion.text)
    reason, sequence = stop_reason(completion, blocks[-1]["type"] == "tool_use")
    return JSONResponse({"id": message_id, "type": "message", "role": "assistant", "model": name,
                         "content": blocks, "stop_reason": reason,
                         "stop_sequence": sequence,
                         "usage": view.usage(output.num_cached_tokens or 0, len(completion.token_ids))})


class _MessageView:
    def __init__(self, message_id: str, model: str, num_prompt_tokens: int, tool: ToolChoice | None = None) -> None:
        self.id = message_id
        self.model = model
        self.num_prompt_tokens = num_prompt_tokens
        self.tool = tool

    def content_blocks(self, text: str) -> list[dict[str, Any]]:
        """A whole output as content blocks: its text, and a ``tool_use`` block per call it makes (an
        output cut short before its call's JSON closed stays text)."""
        if self.tool is None:
            return [{"type": "text", "text": text}]
        content, calls = self.tool.parse(text)
        uses = []
        for call in calls:
            try:
                arguments = json.loads(call["function"]["arguments"])
            except ValueError:
                return [{"type": "text", "text": text}]
            uses.append({"type": "tool_use", "id": call["id"].replace("chatcmpl-tool-", "toolu_"),
                         "name": call["function"]["name"], "input": arguments})
        if not uses:
            return [{"type": "text", "text": text}]
        return ([{"type": "text", "text": content}] if content else []) + uses

    def usage(self, cached: int, output_tokens: int) -> dict[str, int]:
        """Anthropic counts cache reads apart from input_tokens."""
        return {"input_tokens": self.num_prompt_tokens - cached, "output_tokens": output_tokens,
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}

    async def stream(self, outputs):
        output_tokens = 0
        try:
            yield named_event("message_start", {"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": self.usage(0, 0)}})
            live = self._live_block()
            if live is not None:
                yield named_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                          "content_block": live})
            yield named_event("ping", {"type": "ping"})
            text = ""
            with engine_errors():
                async for output in outputs:
                    completion = output.outputs[0]
                    output_tokens += len(completion.token_ids)
                    text += completion.text
                    if completion.text and live is not None:
                        delta = {"type": "text_delta", "text": completion.text} if live["type"] == "text" else \
                            {"type": "input_json_delta", "partial_json": completion.text}
                        yield named_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                                  "delta": delta})
                    if completion.finish_reason is not None:
                        if live is not None:
                            yield named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
                            tool_use = live["type"] == "tool_use" and completion.finish_reason == "stop"
                        else:
                            blocks = self.content_blocks(text)
                            for event in self._whole_blocks(blocks):
                                yield event
                            tool_use = blocks[-1]["type"] == "tool_use"
                        reason, sequence = stop_reason(completion, tool_use)
                        yield named_event("message_delta", {
                            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                            "usage": {"output_tokens": output_tokens}})
                        yield named_event("message_stop", {"type": "message_stop"})
                        return
        except ApiError as error:
            yield named_event("error", error_body(error, PATH))
        except Exception:
            logger.exception("message stream failed")
            yield named_event("error", error_body(ApiError(500, "Internal server error."), PATH))

    def _live_block(self) -> dict[str, Any] | None:
        """The content block streamed as the output comes: the text, or a named tool's ``tool_use``
        (its input as input_json_delta pieces); None when the blocks are known only at the end
        ("any" calls, or "auto", whose text may turn out to be calls)."""
        if self.tool is None:
            return {"type": "text", "text": ""}
        if self.tool.forced and self.tool.named is not None:
            return {"type": "tool_use", "id": f"toolu_{secrets.token_hex(12)}", "name": self.tool.named, "input": {}}
        return None

    def _whole_blocks(self, blocks: list[dict[str, Any]]):
        """Each block of a message whose blocks were known only at its end, whole: start, one delta (the
        text, or a tool's input as one input_json_delta), stop."""
        for index, block in enumerate(blocks):
            if block["type"] == "tool_use":
                block, delta = {**block, "input": {}}, {"type": "input_json_delta",
                                                        "partial_json": json.dumps(block["input"])}
            else:
                block, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            yield named_event("content_block_start", {"type": "content_block_start", "index": index,
                                                      "content_block": block})
            yield named_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            yield named_event("content_block_stop", {"type": "content_block_stop", "index": index})
