"""SchedulerStats: a snapshot of the scheduler's load and counters for logging and metrics."""

from __future__ import annotations

import msgspec


class SchedulerStats(msgspec.Struct, frozen=True, array_like=True):
    """Queue lengths now, KV-cache usage now, and running totals since start (prefix cache in tokens).

    A msgspec struct: each step's EngineCoreOutputs carries it to the front end as it is.
    """

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    spec_num_drafts: int = 0  # verified steps that carried draft tokens
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted draft tokens per draft token verified (0 without speculative decoding)."""
        return self.spec_num_accepted_tokens / self.spec_num_draft_tokens if self.spec_num_draft_tokens else 0.0
