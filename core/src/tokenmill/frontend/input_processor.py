"""InputProcessor: prompts (text, token ids or chat messages) -> validated token ids for the engine."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tokenmill.config import ModelConfig
from tokenmill.sampling_params import SamplingParams
from tokenmill.tokenizer.builtin_templates import builtin_chat_template
from tokenmill.tokenizer.chat_template import render_chat
from tokenmill.tokenizer.content_text import RenderedChat, rendered_token_ids

logger = logging.getLogger("tokenmill")

PromptType = str | Sequence[int] | Mapping[str, Any]


class PromptTooLongError(ValueError):
    """The prompt leaves no room to generate within max_model_len."""


class InputProcessor:
    """Tokenizes and validates prompts; owns nothing but the tokenizer and the model's limits."""

    def __init__(self, tokenizer: Any, model: ModelConfig, max_logprobs: int) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.max_logprobs = max_logprobs
        tokenizer_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        eos = list(model.eos_token_ids)
        if isinstance(tokenizer_eos, int) and tokenizer_eos not in eos:
            eos.append(tokenizer_eos)
        self.eos_token_ids = tuple(eos)
        self.chat_template = model.chat_template
        # True: special-token strings in chat messages become control tokens (else they are text)
        self.allow_special_tokens_in_content = False
        if self.chat_template is None and tokenizer is not None and not getattr(tokenizer, "chat_template", None):
            builtin = builtin_chat_template(model.architecture)
            if builtin is not None:
                self.chat_template = builtin.template
                logger.info("%s has no chat template: using tokenmill's built-in %s template (--chat-template "
                            "overrides it)", model.served_model_name, builtin.family)

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(prompt text or None, token ids) for a string, token ids, or a {"prompt"|"prompt_token_ids"} dict."""
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            if "prompt" in prompt:
                return self.tokenize(str(prompt["prompt"]))
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass token ids")
            return prompt, list(self.tokenizer.encode(prompt))
        return None, [int(t) for t in prompt]

    def chat(self, messages: Sequence[Mapping[str, Any]], chat_template: str | None = None,
             add_generation_prompt: bool = True, **kwargs: Any) -> tuple[str, list[int]]:
        """The rendered chat prompt and its ids (``render_chat``, then ``chat_token_ids``)."""
        rendered = self.render_chat(messages, chat_template, add_generation_prompt, **kwargs)
        return rendered.text, self.chat_token_ids(rendered)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], chat_template: str | None = None,
                    add_generation_prompt: bool = True, **kwargs: Any) -> RenderedChat:
        """The rendered chat prompt: ``chat_template``, else the engine's --chat-template, else the
        model's own, else tokenmill's built-in template for the model's family. Special-token strings
        in the messages are text unless ``allow_special_tokens_in_content``."""
        return render_chat(self.tokenizer, [dict(m) for m in messages],
                           allow_special_tokens_in_content=self.allow_special_tokens_in_content,
                           chat_template=chat_template or self.chat_template,
                           add_generation_prompt=add_generation_prompt, **kwargs)

    def chat_token_ids(self, rendered: RenderedChat) -> list[int]:
        """The token ids of a rendered chat prompt."""
        return rendered_token_ids(self.tokenizer, rendered)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> SamplingParams:
        """Check the prompt against the model; returns params with ``max_tokens`` filled in when unset."""
        limit = self.model.max_model_len
        if not prompt_token_ids:
            raise ValueError("The prompt cannot be empty.")
        vocab = self.model.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"Token id {bad} is out of vocabulary (the vocabulary has {vocab} tokens).")
        if len(prompt_token_ids) >= limit:
            raise PromptTooLongError(
                f"The prompt is {len(prompt_token_ids)} tokens long, but this model's maximum context length is "
                f"{limit} tokens, leaving no room to generate.")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise ValueError(f"Requested {name}={value}, more than the maximum of {self.max_logprobs}.")
        params.check_token_ids(vocab)
        if params.structured_outputs is not None:
            params.structured_outputs.check_grammar()
        if params.max_tokens is None:
            params = params.clone(max_tokens=limit - len(prompt_token_ids))
        return params
