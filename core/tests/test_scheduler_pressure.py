"""Scheduler under pressure: preemption by recompute, aborts at every stage, impossible requests."""

from collections import defaultdict

import pytest

from tokenmill.request import Request, RequestStatus
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig, SchedulerOutput


class FakeRunner:
    """Writes scheduled tokens into KV slots; the 'sampled' token hashes the sequence read back from
    the cache, so any lost or clobbered K/V changes the outputs."""

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


def make_request(request_id: str, prompt_len: int = 6, max_tokens: int | None = 4, first_token: int = 100, **kw):
    return Request(
        request_id, range(first_token, first_token + prompt_len), SamplingParams(max_tokens=max_tokens), **kw
    )


def run_all(scheduler: Scheduler, runner: FakeRunner, max_steps: int = 1000) -> list[SchedulerOutput]:
    outputs = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return outputs
        output = scheduler.schedule()
        outputs.append(output)
        scheduler.update(output, runner.execute(output))
    raise AssertionError("requests did not finish")


def generate(prompts: dict[str, int], **config) -> tuple[dict[str, list[int]], Scheduler, list[SchedulerOutput]]:
    scheduler = make_scheduler(**config)
    requests = [make_request(rid, prompt_len=10, max_tokens=12, first_token=first) for rid, first in prompts.items()]
    for request in requests:
        scheduler.add_request(request)
    outputs = run_all(scheduler, FakeRunner(scheduler.config.block_size))
    return {r.request_id: r.output_token_ids for r in requests}, scheduler, outputs


PROMPTS = {"a": 100, "b": 200, "c": 300, "d": 400}


def test_preemption_with_a_tiny_cache_still_produces_the_same_tokens():
    expected, _, _ = generate(PROMPTS)
    for policy in ("fcfs", "priority"):
        # 21 tokens of K/V per request at most = 6 blocks; 4 requests need 24, the cache has 8
        got, scheduler, outputs = generate(PROMPTS, num_blocks=9, policy=policy)
        assert got == expected
        assert scheduler.stats().num_preemptions > 0
        assert any(o.preempted_request_ids for o in outputs)
        assert scheduler.kv_cache_manager.usage() == 0.0


def test_preemption_takes_the_latest_request_and_requeues_it_first():
    scheduler = make_scheduler(num_blocks=7, enable_prefix_caching=False)  # 6 usable blocks
    first, second = make_request("first", 8, 12), make_request("second", 8, 12, first_token=200)
    scheduler.add_request(first)
    scheduler.add_request(second)
    runner = FakeRunner(4)
    preempted_step = None
    for _ in range(20):
        output = scheduler.schedule()
        if output.preempted_request_ids:
            preempted_step = output
            break
        scheduler.update(output, runner.execute(output))
    assert preempted_step is not None and preempted_step.preempted_request_ids == {"second"}
    assert [s.request_id for s in preempted_step.scheduled] == ["first"]
    assert second.status == RequestStatus.PREEMPTED and second.num_computed_tokens == 0
    assert second.num_preemptions == 1 and second.num_output_tokens > 0
    assert scheduler.waiting.peek() is second
    scheduler.update(preempted_step, runner.execute(preempted_step))
    run_all(scheduler, runner)
    assert first.finish_reason == second.finish_reason == "length"


def test_priority_preemption_unschedules_a_lower_priority_request_and_keeps_going():
    scheduler = make_scheduler(num_blocks=5, policy="priority", enable_prefix_caching=False)  # 4 usable blocks
    runner = FakeRunner(4)

    def run_step() -> SchedulerOutput:
        output = scheduler.schedule()
        scheduler.update(output, runner.execute(output))
        return output

    low = make_request("low", 3, 5, priority=9, arrival_time=1.0)
    scheduler.add_request(low)
    run_step()
    high1 = make_request("high1", 4, 5, first_token=200, priority=0, arrival_time=2.0)
    high2 = make_request("high2", 2, 5, first_token=300, priority=0, arrival_time=3.0)
    scheduler.add_request(high1)
    scheduler.add_request(high2)
    assert [s.request_id for s in run_step().scheduled] == ["low", "high1", "high2"]
    # low (first in the batch) takes the last free block, high1 then needs one: low is preempted
    # out of this step and high2 is still served
    output = run_step()
    assert output.preempted_request_ids == {"low"}
    assert [(s.request_id, s.start_position) for s in output.scheduled] == [("high1", 4), ("high2", 2)]
    run_all(scheduler, runner)
    assert high1.num_preemptions == high2.num_preemptions == 0 and low.num_preemptions >= 1
    assert low.num_output_tokens == 5


def test_a_resumed_request_longer_than_the_budget_is_recomputed_in_chunks():
    scheduler = make_scheduler(
        max_num_batched_tokens=12, enable_chunked_prefill=False, num_blocks=9, enable_prefix_caching=False
    )
    requests = [make_request(rid, 10, 20, first_token=f) for rid, f in (("a", 100), ("b", 200))]
    for request in requests:
        scheduler.add_request(request)
    run_all(scheduler, FakeRunner(4))
    assert scheduler.stats().num_preemptions > 0
    assert all(r.num_output_tokens == 20 for r in requests)


def test_abort_at_every_stage_frees_everything():
    scheduler, runner = make_scheduler(num_blocks=9, enable_prefix_caching=False), FakeRunner(4)
    decoding = make_request("decoding", 6, 20)
    prefilling = make_request("prefilling", 30, 2, first_token=200)
    waiting = make_request("waiting", 6, 4, first_token=300)
    for request in (decoding, prefilling):
        scheduler.add_request(request)
    output = scheduler.schedule()
    scheduler.update(output, runner.execute(output))
    scheduler.add_request(waiting)
    assert decoding.status == prefilling.status == RequestStatus.RUNNING
    assert waiting.status == RequestStatus.WAITING
    assert decoding.num_output_tokens == 1 and 0 < prefilling.num_computed_tokens < prefilling.num_prompt_tokens

    aborted = scheduler.abort_requests(["prefilling", "waiting", "nope"])
    assert [r.request_id for r in aborted] == ["prefilling", "waiting"]
    assert all(r.finish_reason == "abort" for r in aborted)
    assert scheduler.num_running == 1 and scheduler.num_waiting == 0
    reported = scheduler.schedule().finished_request_ids
    assert reported == {"prefilling", "waiting"}

    preempted = make_request("preempted", 6, 20, first_token=400)
    scheduler.add_request(preempted)
    for _ in range(50):
        output = scheduler.schedule()
        scheduler.update(output, runner.execute(output))
        if preempted.status == RequestStatus.PREEMPTED:
            break
    assert preempted.status == RequestStatus.PREEMPTED and scheduler.num_waiting == 1
    assert {r.request_id for r in scheduler.abort_requests(["preempted", "decoding"])} == {"preempted", "decoding"}
    assert not scheduler.has_unfinished_requests()
    assert scheduler.num_waiting == 0 and scheduler.num_running == 0
    assert scheduler.kv_cache_manager.num_free_blocks == 8
    output = scheduler.schedule()
    assert output.is_empty and output.finished_request_ids == {"preempted", "decoding"}


def test_abort_between_schedule_and_update_drops_the_step_for_that_request():
    scheduler, runner = make_scheduler(), FakeRunner(4)
    keep, drop = make_request("keep"), make_request("drop", first_token=200)
    scheduler.add_request(keep)
    scheduler.add_request(drop)
    output = scheduler.schedule()
    sampled = runner.execute(output)
    scheduler.abort_requests(["drop"])
    updates = scheduler.update(output, sampled)
    assert [u.request_id for u in updates] == ["keep"]
    assert drop.num_output_tokens == 0 and drop.num_computed_tokens == 0
    assert scheduler.schedule().finished_request_ids == {"drop"}


def test_finished_ids_are_reported_once_in_the_next_output():
    scheduler, runner = make_scheduler(), FakeRunner(4)
    scheduler.add_request(make_request("a", max_tokens=1))
    output = scheduler.schedule()
    (update,) = scheduler.update(output, runner.execute(output))
    assert update.finished
    assert scheduler.schedule().finished_request_ids == {"a"}
    assert scheduler.schedule().finished_request_ids == set()


def test_impossible_requests_are_rejected_with_the_numbers():
    scheduler = make_scheduler(num_blocks=5, max_model_len=64)  # 4 usable blocks = 16 tokens
    with pytest.raises(
        ValueError,
        match=r"prompt of 10 tokens with max_tokens=10 needs K/V for up to 19 tokens = 5 "
        r"blocks of 4, but the cache has 4 blocks \(16 tokens\)",
    ):
        scheduler.add_request(make_request("big", 10, 10))
    with pytest.raises(ValueError, match="max_tokens=None"):
        scheduler.add_request(make_request("unbounded", 10, None))
    scheduler.add_request(make_request("fits", 10, 7))  # 16 tokens of K/V: the last sampled one is never computed
    with pytest.raises(ValueError, match="more than max_model_len"):
        scheduler.add_request(make_request("too-long", 65, 1))
    with pytest.raises(ValueError, match="empty prompt"):
        scheduler.add_request(make_request("empty", 0, 1))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(make_request("fits", 4, 1))
    assert scheduler.num_waiting == 1
