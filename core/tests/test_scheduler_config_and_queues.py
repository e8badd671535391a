"""SchedulerConfig validation, the waiting queues, and the no-torch rule for the scheduler and KV cache."""

import subprocess
import sys

import pytest

from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import SchedulerConfig
from tokenmill.scheduler.queues import FCFSQueue, PriorityQueue, create_request_queue


def make_request(request_id: str, priority: int = 0, arrival_time: float = 0.0) -> Request:
    return Request(request_id, [1, 2], SamplingParams(), priority=priority, arrival_time=arrival_time)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be at least 1"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be at least 1"),
        ({"max_model_len": 0}, "max_model_len must be at least 1"),
        ({"block_size": 0}, "block_size must be at least 1"),
        ({"num_blocks": 1}, "block 0 is reserved"),
        ({"policy": "lifo"}, "policy must be one of"),
        ({"long_prefill_token_threshold": -1}, "must be >= 0"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**overrides)


def test_config_is_frozen():
    config = SchedulerConfig()
    with pytest.raises(AttributeError):
        config.max_num_seqs = 3  # type: ignore[misc]


def test_fcfs_queue_puts_preempted_requests_first():
    queue = FCFSQueue()
    a, b, c = make_request("a"), make_request("b"), make_request("c")
    queue.add(a)
    queue.add(b)
    queue.add_preempted(c)
    assert [queue.pop().request_id for _ in range(3)] == ["c", "a", "b"]
    assert not queue


def test_priority_queue_orders_by_priority_then_arrival_then_insertion():
    queue = create_request_queue("priority")
    assert isinstance(queue, PriorityQueue)
    for request in (
        make_request("late", 1, 5.0),
        make_request("early", 1, 1.0),
        make_request("urgent", 0, 9.0),
        make_request("tie-1", 2, 3.0),
        make_request("tie-2", 2, 3.0),
    ):
        queue.add(request)
    assert queue.peek().request_id == "urgent"
    assert [queue.pop().request_id for _ in range(5)] == ["urgent", "early", "late", "tie-1", "tie-2"]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_remove_many_keeps_the_rest_in_order(policy):
    queue = create_request_queue(policy)
    for i in range(6):
        queue.add(make_request(f"r{i}", arrival_time=float(i)))
    queue.remove_many({"r1", "r4", "missing"})
    assert len(queue) == 4 and {r.request_id for r in queue} == {"r0", "r2", "r3", "r5"}
    assert [queue.pop().request_id for _ in range(4)] == ["r0", "r2", "r3", "r5"]


def test_unknown_policy_is_an_error():
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'"):
        create_request_queue("lifo")


def test_scheduler_and_kv_cache_import_no_torch():
    code = (
        "import sys; import tokenmill.scheduler, tokenmill.kv_cache, tokenmill.request; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
