"""Usage: token counts of one request in OpenAI's shape (with prefix-cache hits as cached_tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Usage:
    """Counts that grow as a request's outputs arrive."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add_prompt(self, num_tokens: int, num_cached: int) -> None:
        self.prompt_tokens += num_tokens
        self.cached_tokens += num_cached

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
