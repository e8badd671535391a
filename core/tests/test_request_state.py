"""Request: construction from the engine-core message, status, and token-level stop rules."""

import pytest

from tokenmill.request import Request, RequestStatus
from tokenmill.sampling_params import SamplingParams
from tokenmill.wire import EngineCoreRequest

EOS = 2


def make_request(prompt=(5, 6, 7), eos=(EOS,), **params) -> Request:
    return Request("r", list(prompt), SamplingParams(**params), eos_token_ids=eos)


def feed(request: Request, tokens, max_model_len=1000) -> list[int]:
    """Append tokens one by one until a stop; returns the tokens accepted."""
    accepted = []
    for token in tokens:
        request.append_output_token(token)
        accepted.append(token)
        if request.check_stop(max_model_len):
            break
    return accepted


def test_from_engine_core_request_copies_every_field():
    message = EngineCoreRequest(
        request_id="abc",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=4, stop_token_ids=[9]),
        eos_token_ids=[2, 3],
        arrival_time=12.5,
        priority=-1,
        cache_salt="tenant-a",
    )
    request = Request.from_engine_core_request(message)
    assert request.request_id == "abc"
    assert request.prompt_token_ids == [1, 2, 3]
    assert request.all_token_ids == [1, 2, 3]
    assert request.all_token_ids is not message.prompt_token_ids
    assert request.eos_token_ids == {2, 3}
    assert request.stop_token_ids == {9}
    assert request.arrival_time == 12.5
    assert request.priority == -1
    assert request.cache_salt == "tenant-a"
    assert request.status == RequestStatus.WAITING
    assert request.num_computed_tokens == 0 and request.runner_state is None


def test_zero_arrival_time_means_now():
    message = EngineCoreRequest(request_id="x", prompt_token_ids=[1], sampling_params=SamplingParams())
    assert Request.from_engine_core_request(message).arrival_time > 1e9


def test_status_finish_reasons():
    assert not RequestStatus.WAITING.is_finished and RequestStatus.WAITING.finish_reason is None
    assert not RequestStatus.PREEMPTED.is_finished
    assert RequestStatus.FINISHED_STOPPED.finish_reason == "stop"
    assert RequestStatus.FINISHED_LENGTH.finish_reason == "length"
    assert RequestStatus.FINISHED_ABORTED.finish_reason == "abort"
    assert all(s.is_finished for s in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH))


def test_append_keeps_output_and_all_tokens_in_step():
    request = make_request(max_tokens=10)
    feed(request, [11, 12])
    assert request.output_token_ids == [11, 12]
    assert request.all_token_ids == [5, 6, 7, 11, 12]
    assert request.num_tokens == 5 and request.num_output_tokens == 2 and request.num_prompt_tokens == 3
    assert request.first_token_time is not None


def test_eos_stops_with_stop_and_no_stop_reason():
    request = make_request(max_tokens=10)
    assert feed(request, [11, EOS, 12]) == [11, EOS]
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert request.finish_reason == "stop" and request.stop_reason is None
    assert request.finished_time is not None


def test_ignore_eos_keeps_going_until_max_tokens():
    request = make_request(max_tokens=3, ignore_eos=True)
    assert feed(request, [EOS, EOS, EOS, EOS]) == [EOS, EOS, EOS]
    assert request.finish_reason == "length"


def test_stop_token_sets_stop_reason():
    request = make_request(max_tokens=10, stop_token_ids=[42])
    assert feed(request, [11, 42, 12]) == [11, 42]
    assert request.finish_reason == "stop" and request.stop_reason == 42


def test_min_tokens_suppresses_eos_and_stop_tokens_until_reached():
    request = make_request(max_tokens=10, min_tokens=3, stop_token_ids=[42])
    assert feed(request, [EOS, 42, EOS]) == [EOS, 42, EOS]
    assert request.finish_reason == "stop" and request.stop_reason is None
    assert request.num_output_tokens == 3


def test_max_tokens_gives_length():
    request = make_request(max_tokens=2)
    assert feed(request, [11, 12, 13]) == [11, 12]
    assert request.finish_reason == "length"


def test_max_model_len_gives_length_even_without_max_tokens():
    request = make_request(max_tokens=None)
    assert feed(request, range(100, 200), max_model_len=6) == [100, 101, 102]
    assert request.num_tokens == 6 and request.finish_reason == "length"


def test_stop_token_wins_over_length_on_the_same_token():
    request = make_request(max_tokens=2)
    assert feed(request, [11, EOS]) == [11, EOS]
    assert request.finish_reason == "stop"


def test_no_eos_ids_means_no_eos_stop():
    request = make_request(eos=(), max_tokens=3)
    feed(request, [EOS, EOS, EOS])
    assert request.finish_reason == "length"


def test_finish_requires_a_final_status():
    request = make_request()
    with pytest.raises(AssertionError):
        request.finish(RequestStatus.RUNNING)
    request.finish(RequestStatus.FINISHED_STOPPED, stop_reason="###")
    assert request.is_finished and request.stop_reason == "###"
