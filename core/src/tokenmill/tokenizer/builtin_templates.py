"""Built-in chat templates for well-known model families, used when a checkpoint ships none.

GGUF files often lack ``tokenizer.chat_template``. The engine's ``chat_template`` argument always wins;
a model's own template wins over these. Families are recognised by architecture name.
"""

from __future__ import annotations

from dataclasses import dataclass

_TEXT = """{%- if message['content'] is string -%}{{ message['content'] | trim }}
{%- else -%}{%- for item in message['content'] -%}{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}
{%- else -%}{{ raise_exception('only text content is supported') }}{%- endif -%}{%- endfor -%}{%- endif -%}"""

GEMMA = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] if messages[0]['content'] is string "
    "else messages[0]['content'][0]['text'] -%}"
    "{%- set prefix = system + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{{- prefix if loop.first else '' -}}" + _TEXT + "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
"""Gemma 1/2/3 turns: ``<start_of_turn>user ... <end_of_turn>``, the system prompt folded into the
first user turn, "model" for the assistant (as Google's own template)."""

CHATML = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}" + _TEXT + "{{ '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
"""ChatML (Qwen2, Qwen2.5, Qwen3 and their MoE variants)."""

PHI3 = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\n' }}" + _TEXT + "{{ '<|end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)
"""Phi-3 / Phi-3.5 turns: ``<|user|>\\n ... <|end|>``."""


@dataclass(frozen=True)
class BuiltinTemplate:
    """A family's template and the name tokenmill reports when it uses it."""

    family: str
    template: str


_FAMILIES: tuple[tuple[tuple[str, ...], BuiltinTemplate], ...] = (
    (("Gemma",), BuiltinTemplate("gemma", GEMMA)),
    (("Qwen2", "Qwen3"), BuiltinTemplate("chatml", CHATML)),
    (("Phi3",), BuiltinTemplate("phi3", PHI3)),
)


def builtin_chat_template(architecture: str | None) -> BuiltinTemplate | None:
    """The built-in template for a model architecture (e.g. "Gemma3ForCausalLM"), or None."""
    for prefixes, template in _FAMILIES:
        if architecture and architecture.startswith(prefixes):
            return template
    return None
