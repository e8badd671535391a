"""Chat prompts: render a conversation with the model's chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenmill.tokenizer.bounded_render import render_bounded
from tokenmill.tokenizer.content_text import RenderedChat, render_content_as_text, rendered_token_ids
from tokenmill.tokenizer.template_sandbox import TemplateBounds, TemplateLimitError


class ChatTemplateError(ValueError):
    """The model cannot render chat messages (it has no chat template) or the template failed."""


def apply_chat_template(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    template_bounds: TemplateBounds | None = None,
    **template_kwargs: Any,
) -> str:
    """The prompt text for ``messages`` (``{"role", "content"}`` dicts), ending with the assistant
    turn's opening when ``add_generation_prompt``. ``chat_template`` overrides the model's own.

    The text already holds the template's special tokens (BOS, role markers): tokenize it with
    ``add_special_tokens=False`` (``chat_prompt_token_ids`` does). With ``template_bounds`` (for a
    template that came with a request) ``chat_template`` renders in a ``BoundedSandbox`` instead of the
    tokenizer's own Jinja environment, and TemplateLimitError reports a bound it reached.
    """
    if not (chat_template or getattr(tokenizer, "chat_template", None)):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ChatTemplateError(
            f"The tokenizer of {name} has no chat template, so chat messages cannot be turned into a prompt. "
            "Pass a template (a Jinja string) explicitly, or use the plain completions API with a prompt."
        )
    try:
        if template_bounds is not None and chat_template:
            return render_bounded(chat_template, messages, template_bounds, tools=tools,
                                  add_generation_prompt=add_generation_prompt, **template_kwargs)
        return tokenizer.apply_chat_template(
            list(messages),
            chat_template=chat_template,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **template_kwargs,
        )
    except TemplateLimitError:
        raise
    except Exception as error:  # jinja2 raises many types (TemplateError, TypeError, KeyError...)
        raise ChatTemplateError(f"The chat template failed to render the messages: {error}") from error


def render_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], *, allow_special_tokens_in_content: bool = False,
                **kwargs: Any) -> RenderedChat:
    """The rendered prompt (see ``apply_chat_template`` for ``kwargs``), for ``rendered_token_ids``.

    Special-token strings written in the messages' text are tokenized as text, so only the template
    places control tokens (``content_text``); ``allow_special_tokens_in_content`` tokenizes the whole
    prompt as one string instead, where such text becomes control tokens too."""
    if allow_special_tokens_in_content:
        return RenderedChat(apply_chat_template(tokenizer, messages, **kwargs))
    return render_content_as_text(tokenizer, messages, lambda m, **k: apply_chat_template(tokenizer, m, **k), **kwargs)


def chat_prompt_token_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], **kwargs: Any) -> tuple[str, list[int]]:
    """The rendered prompt text and its token ids (``render_chat``'s arguments)."""
    rendered = render_chat(tokenizer, messages, **kwargs)
    return rendered.text, rendered_token_ids(tokenizer, rendered)
