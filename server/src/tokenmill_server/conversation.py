"""Chat conversations for the model's template: OpenAI and Anthropic messages as plain
``{"role", "content"}`` dicts, and the template options a request may set."""

from __future__ import annotations

from typing import Any

from tokenmill_server.errors import bad_request, unsupported
from tokenmill_server.generation import check_text
from tokenmill_server.protocol.anthropic import AnthropicMessage, ContentBlock
from tokenmill_server.protocol.chat import ChatMessage
from tokenmill_server.sampling import RequestLimits

# apply_chat_template's own parameters: a request's chat_template_kwargs must not reach them
_RESERVED_TEMPLATE_KWARGS = {"tokenize", "chat_template", "conversation", "messages", "tools", "documents",
                             "add_generation_prompt", "continue_final_message", "return_tensors", "return_dict",
                             "return_assistant_tokens_mask", "padding", "truncation", "max_length", "tokenizer_kwargs"}


def openai_conversation(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages with their text parts joined; other content types are refused with a clear 400."""
    conversation = []
    for index, message in enumerate(messages):
        param = f"messages.{index}.content"
        content = message.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = check_text(content, param)
        else:
            pieces = []
            for part in content:
                if part.type != "text":
                    raise unsupported(f"Message content of type '{part.type[:40]}' (only text)", param)
                if part.text is None:
                    raise bad_request("A text content part needs a 'text' string.", param)
                pieces.append(check_text(part.text, param))
            text = "\n".join(pieces)
        entry: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role, "content": text}
        if message.name is not None:
            entry["name"] = message.name
        if message.tool_calls is not None:
            entry["tool_calls"] = message.tool_calls
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        conversation.append(entry)
    return conversation


def _block_text(blocks: str | list[ContentBlock], param: str) -> str:
    if isinstance(blocks, str):
        return check_text(blocks, param)
    pieces = []
    for block in blocks:
        if block.type != "text":
            raise unsupported(f"Content blocks of type '{block.type[:40]}' (only text)", param)
        if block.text is None:
            raise bad_request("A text block needs a 'text' string.", param)
        pieces.append(check_text(block.text, param))
    return "\n".join(pieces)


def anthropic_conversation(system: str | list[ContentBlock] | None,
                           messages: list[AnthropicMessage]) -> list[dict[str, Any]]:
    """The system prompt (if any) as a system message, then the user/assistant turns."""
    conversation = []
    if system:
        conversation.append({"role": "system", "content": _block_text(system, "system")})
    for index, message in enumerate(messages):
        conversation.append({"role": message.role, "content": _block_text(message.content, f"messages.{index}.content")})
    return conversation


def template_options(chat_template: str | None, chat_template_kwargs: dict[str, Any] | None,
                     add_generation_prompt: bool, continue_final_message: bool,
                     limits: RequestLimits) -> dict[str, Any]:
    """Keyword arguments for ``AsyncLLM.render_chat``. Request templates need the server's trust."""
    if continue_final_message and add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be true.",
                          "continue_final_message")
    extra = dict(chat_template_kwargs or {})
    if (chat_template is not None or "chat_template" in extra) and not limits.trust_request_chat_template:
        raise bad_request("Chat templates in requests are refused unless the server runs with "
                          "--trust-request-chat-template.", "chat_template")
    template = chat_template if chat_template is not None else extra.get("chat_template")
    kwargs = {key: value for key, value in extra.items() if key not in _RESERVED_TEMPLATE_KWARGS}
    kwargs.update(chat_template=template, add_generation_prompt=add_generation_prompt)
    if continue_final_message:
        kwargs["continue_final_message"] = True
    return kwargs
