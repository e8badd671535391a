"""Sampler: each parameter against a plain reference on hand-made logits, logprobs, seeds, statistics."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from tokenmill.request import Request
from tokenmill.sampling import Sampler, SamplingBatch
from tokenmill.sampling.truncation import apply_min_p, apply_top_k_top_p
from tokenmill.sampling_params import SamplingParams

VOCAB = 32


def make_request(request_id="r", prompt=(1, 2, 3), output=(), eos=(), **params) -> Request:
    request = Request(request_id, list(prompt), SamplingParams(**params), eos_token_ids=eos)
    for token in output:
        request.append_output_token(token)
    return request


def sample(logits, requests, sampler=None):
    batch = SamplingBatch.from_requests(requests, logits.shape[1], logits.device)
    return (sampler or Sampler())(logits, batch)


def distinct_logits(rows, vocab=VOCAB, seed=0, step=0.37):
    """Random logits without ties (so every mask and rank has one right answer)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(vocab, generator=generator).float() * step - 5.0 for _ in range(rows)])


def test_greedy_is_argmax_and_all_greedy_batch_is_plain():
    logits = distinct_logits(5)
    requests = [make_request(f"r{i}", temperature=0.0) for i in range(5)]
    batch = SamplingBatch.from_requests(requests, VOCAB, "cpu")
    assert batch.all_greedy and not batch.needs_processing
    assert batch.temperature is None and batch.top_k is None and batch.top_p is None and batch.penalties is None
    out = Sampler()(logits, batch)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 5


def test_greedy_rows_ignore_truncation_but_see_penalties_and_bias():
    logits = distinct_logits(1)
    best = int(logits.argmax())
    biased = sample(logits, [make_request(temperature=0.0, logit_bias={(best + 1) % VOCAB: 100.0})])
    assert biased.token_ids == [(best + 1) % VOCAB]
    banned = sample(logits, [make_request(temperature=0.0, bad_words_token_ids=[[best]])])
    assert banned.token_ids == [int(logits[0].topk(2).indices[1])]


@pytest.mark.parametrize(
    "vocab, step",
    [(50, 0.37), (3000, 0.01), (3000, 0.0005)],  # full sort; top_p within the best 1024; flat: falls back to a sort
)
def test_top_k_top_p_masks_match_reference(vocab, step):
    logits = distinct_logits(6, vocab=vocab, seed=3, step=step)
    top_k = torch.tensor([1, 5, vocab, 17, vocab, 3])
    top_p = torch.tensor([1.0, 0.5, 0.9, 0.3, 1.0, 0.05])
    got = apply_top_k_top_p(logits, top_k, top_p, max_top_k=17)
    for row in range(6):
        kept = _reference_top_k_top_p(logits[row], int(top_k[row]), float(top_p[row]))
        assert set(torch.isfinite(got[row]).nonzero().flatten().tolist()) == kept
        finite = torch.isfinite(got[row])
        assert torch.equal(got[row][finite], logits[row][finite])

    only_k = apply_top_k_top_p(logits, top_k, None, max_top_k=17)
    only_p = apply_top_k_top_p(logits, None, top_p)
    for row in range(6):
        assert set(torch.isfinite(only_k[row]).nonzero().flatten().tolist()) == _reference_top_k_top_p(
            logits[row], int(top_k[row]), 1.0
        )
        assert set(torch.isfinite(only_p[row]).nonzero().flatten().tolist()) == _reference_top_k_top_p(
            logits[row], vocab, float(top_p[row])
        )


def test_min_p_mask_matches_reference():
    logits = distinct_logits(6, vocab=50, seed=3)
    min_p = torch.tensor([0.0, 0.1, 0.5, 1.0, 0.01, 0.3])
    got = apply_min_p(logits, min_p)
    probs = torch.softmax(logits, -1)
    for row in range(6):
        expected = {t for t in range(50) if probs[row, t] >= min_p[row] * probs[row].max()}
        assert set(torch.isfinite(got[row]).nonzero().flatten().tolist()) == expected


def _reference_top_k_top_p(row_logits, k, p):
    order = sorted(range(len(row_logits)), key=lambda t: -float(row_logits[t]))
    order = order[:k]
    probs = torch.softmax(row_logits[order], -1).tolist()
    kept, mass = set(), 0.0
    for token, prob in zip(order, probs, strict=True):
        if p < 1.0 and mass >= p and kept:
            break
        kept.add(token)
        mass += prob
    return kept


def test_truncation_through_the_sampler_leaves_only_allowed_tokens():
    logits = distinct_logits(1, seed=5).repeat(400, 1)
    top3 = set(logits[0].topk(3).indices.tolist())
    requests = [make_request(f"r{i}", top_k=3) for i in range(400)]
    assert set(sample(logits, requests).token_ids) <= top3
    requests = [make_request(f"r{i}", top_p=1e-6) for i in range(50)]
    assert set(sample(logits[:50], requests).token_ids) == {int(logits[0].argmax())}
    requests = [make_request(f"r{i}", min_p=1.0) for i in range(50)]
    assert set(sample(logits[:50], requests).token_ids) == {int(logits[0].argmax())}


def test_repetition_penalty_matches_hf_and_presence_frequency_follow_openai():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    requests = [
        make_request("a", prompt=[1, 2, 3, 3], output=[4, 4, 5], repetition_penalty=1.7),
        make_request("b", prompt=[6, 7], output=[7, 8, 8, 8], presence_penalty=0.5, frequency_penalty=0.25),
        make_request("c", prompt=[9], output=[10], repetition_penalty=0.8, presence_penalty=-1.0),
    ]
    batch = SamplingBatch.from_requests(requests, VOCAB, "cpu")
    got = batch.penalties.apply(logits.clone())

    expected = logits.clone()
    for row, request in enumerate(requests):
        params = request.sampling_params
        history = torch.tensor([request.prompt_token_ids + request.output_token_ids])
        hf = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)
        expected[row] = hf(history, expected[row : row + 1].clone())[0]
        for token in set(request.output_token_ids):
            count = request.output_token_ids.count(token)
            expected[row, token] -= params.frequency_penalty * count + params.presence_penalty
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_bad_words_ban_the_last_token_only_after_their_prefix():
    logits = torch.zeros(2, VOCAB)
    logits[:, 9] = 5.0
    words = [[3, 9], [11]]
    after_prefix = make_request("a", output=[1, 3], temperature=0.0, bad_words_token_ids=words)
    elsewhere = make_request("b", output=[3, 1], temperature=0.0, bad_words_token_ids=words)
    batch = SamplingBatch.from_requests([after_prefix, elsewhere], VOCAB, "cpu")
    rows, token_ids = batch.banned
    assert sorted(zip(rows.tolist(), token_ids.tolist(), strict=True)) == [(0, 9), (0, 11), (1, 11)]
    out = Sampler()(logits, batch)
    assert out.token_ids[1] == 9 and out.token_ids[0] != 9


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    logits = torch.zeros(3, VOCAB)
    logits[:, 2] = 10.0  # EOS
    logits[:, 5] = 9.0  # a stop token
    early = make_request("a", output=[7], eos=[2], temperature=0.0, min_tokens=3, stop_token_ids=[5])
    ignoring = make_request("b", output=[7], eos=[2], temperature=0.0, min_tokens=3, ignore_eos=True)
    reached = make_request("c", output=[7, 7, 7], eos=[2], temperature=0.0, min_tokens=3, stop_token_ids=[5])
    out = sample(logits, [early, ignoring, reached])
    assert out.token_ids[0] not in (2, 5)
    assert out.token_ids[1] == 2  # ignore_eos: EOS is not a stop, so it is not masked
    assert out.token_ids[2] == 2


def test_allowed_token_ids_and_logit_bias():
    logits = distinct_logits(2, seed=9)
    allowed = [4, 8, 15]
    restricted = make_request("a", temperature=0.0, allowed_token_ids=allowed)
    free = make_request("b", temperature=0.0)
    out = sample(logits, [restricted, free])
    assert out.token_ids[0] == max(allowed, key=lambda t: float(logits[0, t]))
    assert out.token_ids[1] == int(logits[1].argmax())
    random_rows = [make_request(f"r{i}", allowed_token_ids=allowed) for i in range(200)]
    assert set(sample(logits[:1].repeat(200, 1), random_rows).token_ids) <= set(allowed)


def test_logprobs_are_raw_log_softmax_with_true_ranks():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(4)) * 2
    requests = [
        make_request("a", temperature=0.0, logprobs=5, logit_bias={0: 50.0}),
        make_request("b", logprobs=0, seed=3),
        make_request("c"),
        make_request("d", temperature=0.7, logprobs=2, presence_penalty=1.0, output=[1]),
    ]
    out = sample(logits, requests)
    reference = torch.log_softmax(logits, -1)
    assert out.logprobs[2] is None
    for row, k in [(0, 5), (1, 0), (3, 2)]:
        entry = out.logprobs[row]
        assert entry.token_ids[0] == out.token_ids[row]
        assert len(entry.token_ids) == len(entry.logprobs) == len(entry.ranks) == k + 1
        for token, logprob, rank in zip(entry.token_ids, entry.logprobs, entry.ranks, strict=True):
            assert abs(logprob - float(reference[row, token])) < 1e-6
            assert rank == int((reference[row] > reference[row, token]).sum()) + 1
        assert entry.token_ids[1:] == reference[row].topk(k).indices.tolist()
    assert out.token_ids[0] == 0  # the bias changed the choice, not the reported distribution


def test_seeded_rows_give_the_same_tokens_alone_and_in_any_batch():
    steps = 40
    generator = torch.Generator().manual_seed(11)
    step_logits = [torch.randn(6, VOCAB, generator=generator) for _ in range(steps)]
    settings = dict(temperature=0.9, top_p=0.95, top_k=20, min_p=0.01)

    mixed = {
        "seeded": dict(seed=1234, **settings),
        "other_seeded": dict(seed=99, temperature=1.3),
        "unseeded": dict(temperature=1.0),
        "greedy": dict(temperature=0.0),
        "penalised": dict(seed=5, presence_penalty=0.5),
        "plain": dict(),
    }

    def run(row_params, order):
        sampler = Sampler()
        requests = {name: make_request(name, **params) for name, params in row_params.items()}
        tokens = {name: [] for name in row_params}
        for step in range(steps):
            names = order(step)
            logits = torch.stack([step_logits[step][list(mixed).index(n)] for n in names])
            out = sample(logits, [requests[n] for n in names], sampler)
            for name, token in zip(names, out.token_ids, strict=True):
                tokens[name].append(token)
                requests[name].append_output_token(token)
        return tokens

    alone = run({"seeded": mixed["seeded"]}, lambda step: ["seeded"])
    in_batch = run(mixed, lambda step: sorted(mixed, key=lambda n: hash((n, step))))
    assert in_batch["seeded"] == alone["seeded"]
    alone_other = run({"other_seeded": mixed["other_seeded"]}, lambda step: ["other_seeded"])
    assert in_batch["other_seeded"] == alone_other["other_seeded"]
    assert len(set(alone["seeded"])) > 3  # it really sampled


def test_release_forgets_generators():
    sampler = Sampler()
    logits = distinct_logits(1)
    first = [sample(logits, [make_request("r", seed=7)], sampler).token_ids[0] for _ in range(20)]
    sampler.release(["r"])
    again = [sample(logits, [make_request("r", seed=7)], sampler).token_ids[0] for _ in range(20)]
    assert first == again


@pytest.mark.parametrize(
    "params", [dict(), dict(temperature=0.5), dict(top_k=3), dict(top_p=0.8), dict(seeded=True, min_p=0.2)]
)
def test_sampling_distribution_matches_the_processed_probabilities(params):
    torch.manual_seed(0)
    base = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
    expected = torch.softmax(base / params.get("temperature", 1.0), -1)
    if "top_k" in params:
        expected[params["top_k"] :] = 0
    if "top_p" in params:
        keep = (expected.cumsum(0) - expected) < params["top_p"]
        expected = expected * keep
    if "min_p" in params:
        expected = expected * (expected >= params["min_p"] * expected.max())
    expected = expected / expected.sum()
    draws = 20000
    params = dict(params)
    seeded = params.pop("seeded", False)
    requests = [make_request(f"r{i}", seed=i if seeded else None, **params) for i in range(draws)]
    out = sample(base.repeat(draws, 1), requests)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=8).float()
    assert counts[expected == 0].sum() == 0
    support = expected > 0
    chi_square = float((((counts - draws * expected) ** 2)[support] / (draws * expected[support])).sum())
    degrees = int(support.sum()) - 1
    assert chi_square < degrees + 6 * math.sqrt(2 * degrees), (chi_square, counts.tolist())
