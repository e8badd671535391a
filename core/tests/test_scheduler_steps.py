"""Scheduler: step composition (decode first, chunked prefill, limits, policies), prefix hits and forks."""

from collections import defaultdict

import pytest

from tokenmill.request import Request, RequestStatus
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

EOS = 1


class FakeRunner:
    """Plays the model runner: writes each scheduled token into its KV slot and 'samples' a token
    that depends on the whole sequence as read back from the cache, so wrong K/V changes outputs."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.slots: dict[int, dict[int, int]] = defaultdict(dict)

    def execute(self, output: SchedulerOutput) -> dict[str, list[int]]:
        bs = self.block_size
        sampled = {}
        for s in output.scheduled:
            context = [self.slots[s.block_ids[p // bs]].get(p % bs) for p in range(s.start_position)]
            for p, token in enumerate(s.token_ids, start=s.start_position):
                self.slots[s.block_ids[p // bs]][p % bs] = token
            if s.sample:
                sequence = context + s.token_ids
                sampled[s.request_id] = [sum((i + 1) * (t or 0) for i, t in enumerate(sequence)) % 89 + 10]
        return sampled


def make_scheduler(**overrides) -> Scheduler:
    config = dict(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=256, block_size=4, num_blocks=64)
    config.update(overrides)
    return Scheduler(SchedulerConfig(**config))


def make_request(request_id: str, prompt_len: int = 6, max_tokens: int = 4, first_token: int = 100, **kw) -> Request:
    params = SamplingParams(max_tokens=max_tokens, **kw.pop("params", {}))
    return Request(request_id, range(first_token, first_token + prompt_len), params, eos_token_ids=(EOS,), **kw)


def step(scheduler: Scheduler, runner: FakeRunner):
    output = scheduler.schedule()
    assert output.total_num_tokens <= scheduler.config.max_num_batched_tokens
    assert len(output.scheduled) <= scheduler.config.max_num_seqs
    assert scheduler.num_running <= scheduler.config.max_num_seqs
    return output, scheduler.update(output, runner.execute(output))


def admission_order(scheduler: Scheduler, runner: FakeRunner, max_steps: int = 500) -> list[str]:
    order: list[str] = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return order
        output, _ = step(scheduler, runner)
        order += [s.request_id for s in output.scheduled if s.request_id not in order]
    raise AssertionError("requests did not finish")


def run_all(scheduler: Scheduler, runner: FakeRunner, max_steps: int = 500) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = defaultdict(list)
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return dict(outputs)
        for update in step(scheduler, runner)[1]:
            outputs[update.request_id] += update.new_token_ids
    raise AssertionError("requests did not finish")


def test_a_prompt_then_decodes_to_max_tokens():
    scheduler, runner = make_scheduler(), FakeRunner(4)
    request = make_request("a", prompt_len=6, max_tokens=3)
    scheduler.add_request(request)
    output, updates = step(scheduler, runner)
    (s,) = output.scheduled
    assert (s.token_ids, s.start_position, s.sample) == (list(range(100, 106)), 0, True)
    assert len(s.block_ids) == 2 and request.first_scheduled_time is not None
    assert updates[0].new_token_ids == request.output_token_ids and not updates[0].finished
    output, _ = step(scheduler, runner)
    assert output.scheduled[0].token_ids == [request.output_token_ids[0]]
    assert output.scheduled[0].start_position == 6
    run_all(scheduler, runner)
    assert request.num_output_tokens == 3 and request.finish_reason == "length"
    assert scheduler.kv_cache_manager.usage() == 0.0
    assert scheduler.schedule().finished_request_ids == {"a"}
    assert scheduler.schedule().finished_request_ids == set()


def test_chunked_prefill_with_a_16_token_budget():
    scheduler, runner = make_scheduler(max_num_batched_tokens=16), FakeRunner(4)
    request = make_request("long", prompt_len=40, max_tokens=2)
    scheduler.add_request(request)
    chunks = []
    for _ in range(3):
        output, updates = step(scheduler, runner)
        (s,) = output.scheduled
        chunks.append((s.start_position, len(s.token_ids), s.sample))
        assert s.token_ids == request.all_token_ids[s.start_position : s.start_position + len(s.token_ids)]
    assert chunks == [(0, 16, False), (16, 16, False), (32, 8, True)]
    assert request.num_output_tokens == 1 and request.num_computed_tokens == 40


def test_running_decodes_come_before_new_prefills():
    scheduler, runner = make_scheduler(max_num_batched_tokens=16), FakeRunner(4)
    for name in ("a", "b"):
        scheduler.add_request(make_request(name, prompt_len=5, max_tokens=10))
    step(scheduler, runner)
    scheduler.add_request(make_request("c", prompt_len=30, max_tokens=10))
    output, _ = step(scheduler, runner)
    assert [(s.request_id, s.num_tokens) for s in output.scheduled] == [("a", 1), ("b", 1), ("c", 14)]


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole():
    scheduler, runner = make_scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False), FakeRunner(4)
    scheduler.add_request(make_request("a", prompt_len=10, max_tokens=5))
    scheduler.add_request(make_request("b", prompt_len=10, max_tokens=5, first_token=300))
    output, _ = step(scheduler, runner)
    assert [(s.request_id, s.num_tokens) for s in output.scheduled] == [("a", 10)]
    output, _ = step(scheduler, runner)
    assert [(s.request_id, s.num_tokens) for s in output.scheduled] == [("a", 1), ("b", 10)]
    with pytest.raises(ValueError, match="more than max_num_batched_tokens"):
        scheduler.add_request(make_request("c", prompt_len=17))


def test_max_num_seqs_limits_running_requests():
    scheduler, runner = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64), FakeRunner(4)
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}", prompt_len=4, max_tokens=3))
    output, _ = step(scheduler, runner)
    assert [s.request_id for s in output.scheduled] == ["r0", "r1"]
    assert scheduler.num_running == 2 and scheduler.num_waiting == 3
    assert admission_order(scheduler, runner) == ["r0", "r1", "r2", "r3", "r4"]


def test_long_prefill_threshold_caps_each_prefill_chunk():
    scheduler, runner = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=8), FakeRunner(4)
    scheduler.add_request(make_request("a", prompt_len=20))
    scheduler.add_request(make_request("b", prompt_len=20, first_token=300))
    output, _ = step(scheduler, runner)
    assert [(s.request_id, s.num_tokens) for s in output.scheduled] == [("a", 8), ("b", 8)]
    with pytest.raises(ValueError, match="needs enable_chunked_prefill"):
        SchedulerConfig(enable_chunked_prefill=False, long_prefill_token_threshold=8)


def test_priority_policy_admits_lower_values_first_then_earlier_arrivals():
    scheduler, runner = make_scheduler(policy="priority", max_num_seqs=1), FakeRunner(4)
    scheduler.add_request(make_request("late-low", priority=5, arrival_time=1.0))
    scheduler.add_request(make_request("urgent-2", priority=0, arrival_time=3.0))
    scheduler.add_request(make_request("urgent-1", priority=0, arrival_time=2.0))
    assert admission_order(scheduler, runner) == ["urgent-1", "urgent-2", "late-low"]


def test_fcfs_policy_admits_in_arrival_order():
    scheduler, runner = make_scheduler(max_num_seqs=1), FakeRunner(4)
    for name in ("x", "y", "z"):
        scheduler.add_request(make_request(name, priority={"x": 9, "y": 0, "z": 5}[name]))
    assert admission_order(scheduler, runner) == ["x", "y", "z"]


def test_eos_finishes_early_and_frees_blocks():
    scheduler = make_scheduler()
    request = make_request("a", max_tokens=10)
    scheduler.add_request(request)
    output = scheduler.schedule()
    (update,) = scheduler.update(output, {"a": [EOS]})
    assert update.finished and update.new_token_ids == [EOS] and request.finish_reason == "stop"
    assert not scheduler.has_unfinished_requests() and scheduler.kv_cache_manager.usage() == 0.0


def test_multiple_sampled_tokens_stop_at_the_first_stop():
    scheduler = make_scheduler()
    request = make_request("a", max_tokens=10, params={"stop_token_ids": [7]})
    scheduler.add_request(request)
    (update,) = scheduler.update(scheduler.schedule(), {"a": [5, 7, 9]})
    assert update.new_token_ids == [5, 7] and update.finished and request.stop_reason == 7


def test_sampling_without_a_token_is_an_error():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a"))
    with pytest.raises(ValueError, match="no token was sampled"):
        scheduler.update(scheduler.schedule(), {})


def test_prefix_cache_hit_skips_cached_tokens():
    scheduler, runner = make_scheduler(max_num_batched_tokens=64), FakeRunner(4)
    first = make_request("first", prompt_len=10, max_tokens=2)
    scheduler.add_request(first)
    run_all(scheduler, runner)
    second = make_request("second", prompt_len=10, max_tokens=2)
    scheduler.add_request(second)
    output, _ = step(scheduler, runner)
    (s,) = output.scheduled
    assert s.start_position == 8 and s.token_ids == [108, 109]
    assert second.num_cached_tokens == 8
    run_all(scheduler, runner)
    assert second.output_token_ids == first.output_token_ids
    stats = scheduler.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (20, 8)


@pytest.mark.parametrize("caching", [False, True])
def test_forks_wait_for_the_parents_prompt_then_share_its_blocks(caching):
    scheduler, runner = make_scheduler(enable_prefix_caching=caching), FakeRunner(4)
    parent = make_request("p", prompt_len=10, max_tokens=3)
    children = [make_request(f"p-{i}", prompt_len=10, max_tokens=3) for i in (1, 2)]
    scheduler.add_request(parent)
    for child in children:
        scheduler.add_request(child, fork_of="p")
    output, _ = step(scheduler, runner)
    assert [s.request_id for s in output.scheduled] == ["p"]  # the children do not compute their own copy
    output, _ = step(scheduler, runner)
    parent_blocks = scheduler.kv_cache_manager.get_block_ids("p")
    for s in output.scheduled[1:]:
        assert s.start_position == 8 and s.token_ids == [108, 109]
        assert s.block_ids[:2] == parent_blocks[:2] and s.block_ids[2] != parent_blocks[2]
    assert [s.request_id for s in output.scheduled] == ["p", "p-1", "p-2"]
    assert [scheduler.kv_cache_manager.block_pool.blocks[b].ref_cnt for b in parent_blocks] == [3, 3, 1]
    run_all(scheduler, runner)
    for child in children:
        assert child.output_token_ids == parent.output_token_ids and child.finish_reason == "length"


def test_a_fork_does_not_wait_for_a_parent_that_is_not_running():
    scheduler, runner = make_scheduler(max_num_seqs=1), FakeRunner(4)
    scheduler.add_request(make_request("other", prompt_len=10, max_tokens=3, first_token=500))
    scheduler.add_request(make_request("p", prompt_len=10, max_tokens=3))
    scheduler.add_request(make_request("p-1", prompt_len=10, max_tokens=3), fork_of="p")
    scheduler.abort_requests(["p"])
    assert admission_order(scheduler, runner) == ["other", "p-1"]

    # a fork queued ahead of its parent (here by priority) must not wait for it, or neither would run
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    scheduler.add_request(make_request("p", prompt_len=10, max_tokens=3, priority=5))
    scheduler.add_request(make_request("p-1", prompt_len=10, max_tokens=3, priority=0), fork_of="p")
    assert admission_order(scheduler, runner) == ["p-1", "p"]


def test_stats_snapshot():
    scheduler, runner = make_scheduler(max_num_seqs=1, num_blocks=11), FakeRunner(4)
    scheduler.add_request(make_request("a", prompt_len=8))
    scheduler.add_request(make_request("b", prompt_len=8))
    step(scheduler, runner)
    stats = scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_preemptions) == (1, 1, 0)
    assert stats.kv_cache_usage == pytest.approx(0.2)
    assert stats.prefix_cache_hit_rate == 0.0


def test_finish_requests_for_a_front_end_stop_string():
    scheduler, runner = make_scheduler(), FakeRunner(4)
    scheduler.add_request(make_request("a", max_tokens=50))
    step(scheduler, runner)
    (finished,) = scheduler.finish_requests("a", RequestStatus.FINISHED_STOPPED, stop_reason="\n\n")
    assert finished.finish_reason == "stop" and finished.stop_reason == "\n\n"
    assert scheduler.num_running == 0 and scheduler.kv_cache_manager.usage() == 0.0
    assert scheduler.finish_requests(["a", "unknown"], RequestStatus.FINISHED_STOPPED) == []
    assert scheduler.schedule().finished_request_ids == {"a"}
