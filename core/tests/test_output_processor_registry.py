"""OutputProcessor as the front end's one request registry: queues, fan-out counts, step statistics, aborts."""

from __future__ import annotations

import asyncio

from tokenmill.frontend.output_processor import OutputProcessor
from tokenmill.frontend.stats import IterationStats
from tokenmill.sampling_params import SamplingParams
from tokenmill.wire import EngineCoreOutput, EngineCoreRequest


def request(request_id, prompt_ids, arrival_time=10.0, **params):
    return EngineCoreRequest(request_id, prompt_ids, SamplingParams(detokenize=False, **params),
                             arrival_time=arrival_time)


def test_queued_requests_get_their_outputs_in_the_queue_and_leave_when_finished():
    processor, queue = OutputProcessor(), asyncio.Queue()
    processor.add_request(request("q", [1, 2]), None, queue=queue)
    processor.add_request(request("plain", [1]), None)
    returned, _ = processor.process([EngineCoreOutput("q", [5]), EngineCoreOutput("plain", [6], finish_reason="length")])
    assert [o.request_id for o in returned] == ["plain"]
    assert queue.get_nowait().outputs[0].token_ids == [5]
    processor.process([EngineCoreOutput("q", [7], finish_reason="stop")])
    final = queue.get_nowait()
    assert final.finished and final.outputs[0].token_ids == [5, 7]
    assert not processor.has_unfinished_requests() and processor.num_sequences == 0


def test_children_count_as_sequences_until_the_parent_finishes_and_map_back_to_it():
    processor = OutputProcessor()
    processor.add_request(request("r", [1], n=3), None)
    assert processor.num_sequences == 3 and processor.num_unfinished_requests == 1
    assert processor.request_of("2_r").request_id == "r" and processor.request_of("r") is None
    processor.process([EngineCoreOutput("0_r", [4], finish_reason="length")])
    assert processor.num_sequences == 3 and processor.request_of("0_r") is None
    assert processor.abort(["r"]) == ["1_r", "2_r"]
    assert processor.num_sequences == 0 and processor.requests() == []
    assert processor.abort(["r"]) == []


def test_step_statistics_count_each_request_once_per_step():
    processor = OutputProcessor()
    processor.add_request(request("r", [1, 2, 3], n=2), None)
    first = IterationStats(12.0)
    processor.process([EngineCoreOutput("0_r", [4]), EngineCoreOutput("1_r", [5, 6])], 12.0, first)
    assert first.time_to_first_token == [2.0] and first.inter_token_latency == []
    assert (first.num_prompt_tokens, first.num_generation_tokens) == (3, 3)
    second = IterationStats(12.5)
    processor.process([EngineCoreOutput("0_r", [7], finish_reason="length"),
                       EngineCoreOutput("1_r", [8], finish_reason="stop")], 12.5, second)
    assert second.time_to_first_token == [] and second.inter_token_latency == [0.5]
    assert (second.num_prompt_tokens, second.num_generation_tokens) == (0, 2)
    (finished,) = second.finished
    assert (finished.finish_reason, finished.e2e_latency, finished.num_prompt_tokens,
            finished.num_generation_tokens) == ("length", 2.5, 3, 5)


def test_an_abort_is_recorded_once_with_the_tokens_generated_so_far():
    processor = OutputProcessor()
    processor.add_request(request("r", [1, 2]), None)
    processor.process([EngineCoreOutput("r", [4, 5])], 11.0)
    stats = IterationStats(13.0)
    assert processor.abort(["r", "unknown"], stats) == ["r"]
    (aborted,) = stats.finished
    assert (aborted.finish_reason, aborted.e2e_latency, aborted.num_prompt_tokens,
            aborted.num_generation_tokens) == ("abort", 3.0, 2, 2)
    again = IterationStats(14.0)
    assert processor.abort(["r"], again) == [] and again.finished == []
    assert processor.process([EngineCoreOutput("r", [6])], 14.0) == ([], [])  # a late output is dropped
