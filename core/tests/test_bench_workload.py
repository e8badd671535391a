"""The benchmark workload's time-to-first-token prompts: same length, no shared prefix with the run
or with each other."""

from __future__ import annotations

from tokenmill.benchmarks.harness import exit_status, ttft_prompts


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
