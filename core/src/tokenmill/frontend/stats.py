"""Front-end statistics of the async engine: per finished request and per engine step, for metrics and logs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmill.outputs import RequestMetrics
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

    def record_tokens(self, metrics: RequestMetrics, num_prompt_tokens: int, num_new_tokens: int, now: float,
                      first_in_step: bool) -> None:
        """Count one engine output's new tokens. A request's first output of the step also adds its
        time to first token (and its prompt tokens) or one inter-token latency; call it before
        ``metrics`` records the output."""
        self.num_generation_tokens += num_new_tokens
        if not first_in_step:
            return
        if metrics.first_token_time is None:
            self.time_to_first_token.append(now - metrics.arrival_time)
            self.num_prompt_tokens += num_prompt_tokens
        else:
            self.inter_token_latency.append(now - metrics.last_token_time)


StatsListener = Callable[[IterationStats], None]
