"""Prompt logprobs: one entry per prompt token (first None), the same whichever way the prompt is chunked."""

from __future__ import annotations

import torch

from tokenmill.sampling import logprobs as logprobs_module
from tokenmill.sampling import prompt_logprobs_for_chunk

VOCAB = 40


def test_prompt_logprobs_score_the_next_prompt_token():
    prompt = [3, 17, 5, 5, 39, 0, 12]
    logits = torch.randn(len(prompt), VOCAB, generator=torch.Generator().manual_seed(0))
    entries = prompt_logprobs_for_chunk(logits, prompt, start_position=0, num_logprobs=3)
    assert len(entries) == len(prompt) and entries[0] is None
    reference = torch.log_softmax(logits, -1)
    for position in range(1, len(prompt)):
        entry = entries[position]
        scored_by = reference[position - 1]
        token = prompt[position]
        assert entry.token_ids[0] == token
        assert abs(entry.logprobs[0] - float(scored_by[token])) < 1e-6
        assert entry.ranks[0] == int((scored_by > scored_by[token]).sum()) + 1
        assert entry.token_ids[1:] == scored_by.topk(3).indices.tolist()
        assert entry.ranks[1:] == [1, 2, 3]


def test_chunked_prompt_gives_the_same_entries(monkeypatch):
    monkeypatch.setattr(logprobs_module, "_PROMPT_SLICE", 3)  # also exercise the internal slicing
    prompt = list(range(2, 22))
    logits = torch.randn(len(prompt) + 2, VOCAB, generator=torch.Generator().manual_seed(1))  # + 2 recomputed outputs
    whole = prompt_logprobs_for_chunk(logits[: len(prompt)], prompt, 0, 2)
    chunked = []
    for start, end in [(0, 7), (7, 8), (8, 19), (19, 22)]:
        chunked += prompt_logprobs_for_chunk(logits[start:end], prompt, start, 2)
    assert len(chunked) == len(prompt)
    assert chunked == whole


def test_zero_logprobs_returns_only_the_prompt_token():
    prompt = [1, 2]
    entries = prompt_logprobs_for_chunk(torch.zeros(2, VOCAB), prompt, 0, 0)
    assert entries[0] is None
    assert entries[1].token_ids == [2] and entries[1].ranks == [1]
    assert abs(entries[1].logprobs[0] + torch.log(torch.tensor(float(VOCAB)))) < 1e-6
