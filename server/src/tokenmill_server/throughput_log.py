"""ThroughputLog: a log line every few seconds while the engine is busy — prompt and generation
throughput, running and waiting requests, KV-cache use and prefix-cache hit rate."""

from __future__ import annotations

import asyncio
import logging
import time

from tokenmill.frontend.async_llm import IterationStats
from tokenmill.scheduler.stats import SchedulerStats

logger = logging.getLogger("tokenmill.server")


class ThroughputLog:
    """Feed it IterationStats (a stats listener); ``run`` logs until cancelled."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._scheduler: SchedulerStats | None = None
        self._last_time = time.monotonic()
        self._last_prefix = (0, 0)
        self._last_spec = (0, 0)  # draft tokens verified, accepted

    def observe(self, stats: IterationStats) -> None:
        self._prompt_tokens += stats.num_prompt_tokens
        self._generation_tokens += stats.num_generation_tokens
        if stats.scheduler is not None:
            self._scheduler = stats.scheduler

    def line(self) -> str | None:
        """The next log line, or None when nothing happened since the last one."""
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        scheduler = self._scheduler
        busy = scheduler is not None and (scheduler.num_running or scheduler.num_waiting)
        if not (self._prompt_tokens or self._generation_tokens or busy):
            self._last_time = now
            return None
        running = scheduler.num_running if scheduler else 0
        waiting = scheduler.num_waiting if scheduler else 0
        usage = scheduler.kv_cache_usage if scheduler else 0.0
        queries, hits = (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) if scheduler else (0, 0)
        new_queries, new_hits = queries - self._last_prefix[0], hits - self._last_prefix[1]
        hit_rate = new_hits / new_queries if new_queries else 0.0
        line = (f"prompt throughput: {self._prompt_tokens / elapsed:.1f} tokens/s, generation throughput: "
                f"{self._generation_tokens / elapsed:.1f} tokens/s, running: {running} reqs, waiting: {waiting} reqs, "
                f"KV cache usage: {usage:.1%}, prefix cache hit rate: {hit_rate:.1%}")
        if scheduler is not None and scheduler.spec_num_draft_tokens > self._last_spec[0]:
            drafted = scheduler.spec_num_draft_tokens - self._last_spec[0]
            accepted = scheduler.spec_num_accepted_tokens - self._last_spec[1]
            line += f", draft acceptance rate: {accepted / drafted:.1%}"
            self._last_spec = (scheduler.spec_num_draft_tokens, scheduler.spec_num_accepted_tokens)
        self._prompt_tokens = self._generation_tokens = 0
        self._last_time, self._last_prefix = now, (queries, hits)
        return line

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            line = self.line()
            if line is not None:
                logger.info(line)
