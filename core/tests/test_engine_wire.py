"""The wire between the front end and the engine core: every message kind survives its frame, and
the scheduler's stats travel as one struct."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from tokenmill import wire
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.stats import SchedulerStats
from tokenmill.wire import (
    EngineCoreEmbeddings,
    EngineCoreEmbedRequest,
    EngineCoreFailure,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    LogprobsEntry,
)


def roundtrip(kind, message):
    frame_kind, payload = wire.frame(kind, message)
    assert frame_kind == kind and isinstance(payload, bytes)
    return wire.decode(frame_kind, payload)


def test_step_outputs_carry_the_scheduler_stats_as_one_struct():
    stats = SchedulerStats(num_running=2, num_waiting=1, kv_cache_usage=0.25, prefix_cache_queries=40,
                           prefix_cache_hits=10, num_preemptions=3, spec_num_drafts=4, spec_num_draft_tokens=16,
                           spec_num_accepted_tokens=12)
    step = EngineCoreOutputs([EngineCoreOutput("r", [5, 6], new_logprobs=[LogprobsEntry([5], [-0.5], [1])] * 2,
                                               finish_reason="stop", stop_reason=7, num_cached_tokens=16)],
                             timestamp=12.5, scheduler_stats=stats)
    received = roundtrip(wire.OUTPUTS, step)
    assert received == step and isinstance(received.scheduler_stats, SchedulerStats)
    assert received.scheduler_stats.prefix_cache_hit_rate == 0.25 and received.scheduler_stats.spec_acceptance_rate == 0.75


def test_front_end_messages_roundtrip():
    requests = [EngineCoreRequest("0_r", [1, 2], SamplingParams(n=1, seed=3, stop=["x"]), eos_token_ids=[0],
                                  arrival_time=1.5, priority=2, cache_salt="s"),
                EngineCoreRequest("1_r", [1, 2], SamplingParams(seed=4), fork_of="0_r")]
    assert roundtrip(wire.ADD, requests) == requests
    assert roundtrip(wire.EMBED, EngineCoreEmbedRequest("e", [[1], [2, 3]])) == EngineCoreEmbedRequest("e", [[1], [2, 3]])
    assert roundtrip(wire.ABORT, ["a", "b"]) == ["a", "b"] and roundtrip(wire.FINISH, ["c"]) == ["c"]
    assert wire.frame(wire.SHUTDOWN) == [wire.SHUTDOWN, b""] and roundtrip(wire.SHUTDOWN, None) is None


def test_engine_messages_roundtrip():
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3)
    received = roundtrip(wire.EMBEDDINGS, EngineCoreEmbeddings.from_array("e", vectors))
    np.testing.assert_array_equal(received.vectors(), vectors)
    assert roundtrip(wire.REJECTED, EngineCoreFailure("too long", "r")) == EngineCoreFailure("too long", "r")
    assert roundtrip(wire.DEAD, EngineCoreFailure("boom")).request_id is None


def test_unknown_kinds_and_malformed_payloads_are_errors():
    with pytest.raises(KeyError):
        wire.decode(b"bogus", b"")
    with pytest.raises(msgspec.DecodeError):
        wire.decode(wire.ABORT, msgspec.msgpack.encode({"not": "ids"}))
