"""``POST /v1/chat/completions`` request: messages rendered with the model's chat template."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tokenmill_server.protocol.common import INT64_MAX, ApiModel, SamplingFields


class ContentPart(ApiModel):
    """One part of a message's content; only ``text`` parts are supported."""

    type: str
    text: str | None = None


class ChatMessage(ApiModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ResponseFormat(ApiModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingFields):
    """OpenAI chat completions, with vLLM's extras (chat template controls, echo, sampling)."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT64_MAX, description="Deprecated alias of max_completion_tokens.")
    max_completion_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=INT64_MAX)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = Field(None, description="Refused unless the server trusts request templates.")
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None
    reasoning_effort: str | None = None

    def output_limit(self) -> int | None:
        """max_completion_tokens wins over max_tokens."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
