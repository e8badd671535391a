"""Front-end statistics of the async engine: per finished request and per engine step, for metrics and logs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmill.scheduler.stats import SchedulerStats


@dataclass
class FinishedRequestStats:
    """One user request that ended (finished, stopped, or aborted)."""

    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int


@dataclass
class IterationStats:
    """What changed in one engine step (or one abort), for metrics and the periodic log line.

    ``scheduler`` holds the engine's gauges and running totals; it is None for front-end-only events.
    """

    timestamp: float
    scheduler: SchedulerStats | None = None
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_token: list[float] = field(default_factory=list)
    inter_token_latency: list[float] = field(default_factory=list)
    finished: list[FinishedRequestStats] = field(default_factory=list)


StatsListener = Callable[[IterationStats], None]
