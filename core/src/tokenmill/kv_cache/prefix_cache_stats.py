"""PrefixCacheStats: how many prompt tokens were looked up in the prefix cache and how many hit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Counted in tokens, once per admission (a re-admission after preemption counts again)."""

    queries: int = 0
    hits: int = 0

    def record(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.queries += num_queried_tokens
        self.hits += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def reset(self) -> None:
        self.queries = 0
        self.hits = 0
