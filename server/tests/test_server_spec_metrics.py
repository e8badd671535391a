"""Speculative-decoding counters from the engine's running totals into /metrics and the throughput log."""

from prometheus_client import CollectorRegistry, generate_latest

from tokenmill.frontend.stats import IterationStats
from tokenmill.scheduler.stats import SchedulerStats
from tokenmill_server.metrics import ServerMetrics
from tokenmill_server.throughput_log import ThroughputLog


def stats(drafts: int, draft_tokens: int, accepted: int) -> IterationStats:
    return IterationStats(0.0, scheduler=SchedulerStats(
        num_running=1, num_waiting=0, kv_cache_usage=0.1, prefix_cache_queries=0, prefix_cache_hits=0,
        num_preemptions=0, spec_num_drafts=drafts, spec_num_draft_tokens=draft_tokens,
        spec_num_accepted_tokens=accepted))


def test_totals_become_counters_and_the_log_reports_the_recent_acceptance():
    registry = CollectorRegistry()
    metrics = ServerMetrics("m", max_model_len=64, registry=registry)
    log = ThroughputLog(interval=10.0)
    for step in (stats(2, 8, 6), stats(5, 20, 18)):
        metrics.observe(step)
        log.observe(step)
    text = generate_latest(registry).decode()
    assert 'tokenmill:spec_decode_num_drafts_total{model_name="m"} 5.0' in text
    assert 'tokenmill:spec_decode_num_draft_tokens_total{model_name="m"} 20.0' in text
    assert 'tokenmill:spec_decode_num_accepted_tokens_total{model_name="m"} 18.0' in text
    assert log.line().endswith("draft acceptance rate: 90.0%")
    log.observe(stats(6, 24, 19))
    assert log.line().endswith("draft acceptance rate: 25.0%")  # 1 of the 4 drafted since the last line
