"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` requests (Anthropic's Messages API)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tokenmill_server.protocol.common import INT64_MAX, ApiModel, FiniteFloat


class ContentBlock(ApiModel):
    """One content block; only ``text`` blocks are supported."""

    type: str
    text: str | None = None


class AnthropicMessage(ApiModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class CountTokensRequest(ApiModel):
    model: str | None = None
    messages: list[AnthropicMessage] = Field(..., min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(..., ge=1, le=INT64_MAX)
    stop_sequences: list[str] | None = None
    temperature: FiniteFloat | None = Field(None, ge=0.0, le=1.0)
    top_p: FiniteFloat | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT64_MAX)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
