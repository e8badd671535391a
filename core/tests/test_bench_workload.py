"""The benchmark workload's time-to-first-token prompts (same length, no shared prefix with the run or
with each other), the median of repeated runs, and how the table reports them."""

from __future__ import annotations

import itertools

from tokenmill.benchmarks import engine_process
from tokenmill.benchmarks.engine_process import timed_runs
from tokenmill.benchmarks.harness import exit_status, render, ttft_prompts


def test_ttft_prompts_share_no_prefix_but_the_length():
    prompt = [1, 9690, 198, 2683]
    probes = ttft_prompts(prompt)
    assert len(probes) == 5
    assert all(len(probe) == len(prompt) and probe[1:] == prompt[1:] for probe in probes)
    assert len({probe[0] for probe in probes} | {prompt[0]}) == 6


def test_ttft_prompts_stay_inside_the_vocabulary():
    assert [probe[0] for probe in ttft_prompts([0, 5], count=3)] == [1, 2, 3]
    assert [probe[0] for probe in ttft_prompts([49151, 5], count=2)] == [49150, 49149]


def test_exit_status_names_the_signal_that_ended_an_engine():
    assert exit_status(1) == "exit code 1"
    assert exit_status(-9) == "killed by SIGKILL"
    assert exit_status(-4).startswith("killed by SIGILL (illegal instruction")


def test_timed_runs_report_the_median_run_and_whether_runs_agree(monkeypatch):
    clock = itertools.accumulate([0.0, 4.0, 0.0, 2.0, 0.0, 8.0])  # runs of 4, 2 and 8 seconds
    monkeypatch.setattr(engine_process.time, "perf_counter", lambda: next(clock))
    outputs = iter([[[1, 2], [3, 4]], [[1, 2], [3, 4]], [[1, 2], [3, 5]]])
    result = timed_runs(lambda: next(outputs), 3)
    assert result["elapsed_s"] == 4.0 and result["output_tokens"] == 4 and result["output_tok_s"] == 1.0
    assert result["runs_output_tok_s"] == [1.0, 2.0, 0.5]
    assert result["outputs"] == [[1, 2], [3, 4]] and result["runs_identical"] is False


def test_the_table_lists_every_run_behind_a_median():
    workload = {"name": "W1", "prompts": [[1, 2, 3]], "output_len": 4}
    result = {"output_tok_s": 1.0, "load_s": 0.5, "runs_output_tok_s": [1.0, 2.0, 0.5], "runs_identical": False}
    line = render(workload, {"tokenmill": result}, {}).splitlines()[1]
    assert "(median of 3 runs: 1.0, 2.0, 0.5)" in line and line.endswith("runs differ")
    single = render(workload, {"tokenmill": {**result, "runs_output_tok_s": [1.0], "runs_identical": True}}, {})
    assert "median" not in single and "differ" not in single
