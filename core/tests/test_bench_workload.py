"""The benchmark workload's time-to-first-token prompt: same length, no shared prefix with the run."""

from __future__ import annotations

from tokenmill.benchmarks.harness import ttft_prompt


def test_ttft_prompt_shares_no_prefix_but_the_length():
    prompt = [1, 9690, 198, 2683]
    probe = ttft_prompt(prompt)
    assert len(probe) == len(prompt) and probe[0] != prompt[0] and probe[1:] == prompt[1:]
    assert ttft_prompt([0, 5])[0] == 1
