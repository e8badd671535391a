"""``POST /tokenize`` and ``POST /detokenize`` requests."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tokenmill_server.protocol.chat import ChatMessage
from tokenmill_server.protocol.common import ApiModel, TokenId


class TokenizeRequest(ApiModel):
    """Either ``prompt`` (text) or ``messages`` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(ApiModel):
    model: str | None = None
    tokens: list[TokenId]
