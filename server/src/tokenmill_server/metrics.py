"""Prometheus metrics with vLLM's names under a ``tokenmill:`` prefix, fed by the engine's
IterationStats (one per step or abort). Each app has its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tokenmill.frontend.async_llm import IterationStats
from tokenmill_server.event_stream import StreamGauge

PREFIX = "tokenmill:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")


def one_two_five_buckets(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's token-count buckets)."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return buckets
            buckets.append(value)
        exponent += 1


class ServerMetrics:
    """The server's metrics for one model."""

    def __init__(self, model_name: str, max_model_len: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        r, name = self.registry, model_name

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(PREFIX + metric, doc, labels, registry=r).labels(name)

        def counter(metric: str, doc: str) -> Counter:
            return Counter(PREFIX + metric, doc, labels, registry=r).labels(name)

        def histogram(metric: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + metric, doc, labels, buckets=buckets, registry=r).labels(name)

        self.num_requests_running = gauge("num_requests_running", "Requests in the execution batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "KV-cache usage (1 = full).")
        self.prompt_tokens = counter("prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.prefix_cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.num_preemptions = counter("num_preemptions", "Preemptions (requests evicted and recomputed).")
        self.spec_decode_num_drafts = counter("spec_decode_num_drafts", "Speculative-decoding steps that verified drafts.")
        self.spec_decode_num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_decode_num_accepted_tokens = counter("spec_decode_num_accepted_tokens",
                                                       "Draft tokens the model confirmed.")
        self.admission_rejections = counter("admission_rejections", "Requests refused because the queue was full.")
        self._success = Counter(PREFIX + "request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=r)
        self.request_success = {reason: self._success.labels(name, reason) for reason in FINISH_REASONS}
        token_buckets = one_two_five_buckets(max_model_len)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request.", token_buckets)
        self.request_generation_tokens = histogram("request_generation_tokens", "Generated tokens per request.",
                                                   token_buckets)
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between output tokens.",
                                             ITL_BUCKETS)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "Request latency, arrival to finish.",
                                             E2E_BUCKETS)
        self.slow_reader_aborts = counter("slow_reader_aborts", "Streams stopped because the client read too slowly.")
        self._timeouts = Counter(PREFIX + "connection_timeouts", "Connections closed because the client sent its "
                                 "request (kind=read) or read the response (kind=write) too slowly.",
                                 ["model_name", "kind"], registry=r)
        self.connection_timeouts = {kind: self._timeouts.labels(name, kind) for kind in ("read", "write")}
        self.streams = StreamGauge(self.slow_reader_aborts.inc)
        gauge("stream_buffered_bytes", "Stream output formatted but not yet sent, over all streams.").set_function(
            lambda: self.streams.buffered_bytes)
        gauge("stream_buffered_bytes_max", "The most unsent output one stream has held.").set_function(
            lambda: self.streams.max_stream_bytes)
        self._totals = (0, 0, 0, 0, 0, 0)

    def observe(self, stats: IterationStats) -> None:
        """Apply one IterationStats (the AsyncLLM's stats listener)."""
        scheduler = stats.scheduler
        if scheduler is not None:
            self.num_requests_running.set(scheduler.num_running)
            self.num_requests_waiting.set(scheduler.num_waiting)
            self.kv_cache_usage.set(scheduler.kv_cache_usage)
            totals = (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits, scheduler.num_preemptions,
                      scheduler.spec_num_drafts, scheduler.spec_num_draft_tokens, scheduler.spec_num_accepted_tokens)
            counters = (self.prefix_cache_queries, self.prefix_cache_hits, self.num_preemptions,
                        self.spec_decode_num_drafts, self.spec_decode_num_draft_tokens,
                        self.spec_decode_num_accepted_tokens)
            for counter, new, old in zip(counters, totals, self._totals, strict=True):
                if new > old:
                    counter.inc(new - old)
            self._totals = totals
        if stats.num_prompt_tokens:
            self.prompt_tokens.inc(stats.num_prompt_tokens)
        if stats.num_generation_tokens:
            self.generation_tokens.inc(stats.num_generation_tokens)
        for value in stats.time_to_first_token:
            self.time_to_first_token.observe(value)
        for value in stats.inter_token_latency:
            self.inter_token_latency.observe(value)
        for finished in stats.finished:
            reason = finished.finish_reason
            if reason not in self.request_success:
                self.request_success[reason] = self._success.labels(self.model_name, reason)
            self.request_success[reason].inc()
            self.e2e_request_latency.observe(finished.e2e_latency)
            self.request_prompt_tokens.observe(finished.num_prompt_tokens)
            self.request_generation_tokens.observe(finished.num_generation_tokens)

    def connection_timed_out(self, kind: str) -> None:
        """Count a connection closed by the read or write timeout."""
        self.connection_timeouts[kind].inc()

    def admission_rejected(self) -> None:
        self.admission_rejections.inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
