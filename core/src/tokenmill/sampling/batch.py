"""SamplingBatch: one step's per-row sampling settings, gathered from the requests once per step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tokenmill.sampling.penalties import Penalties

if TYPE_CHECKING:
    from tokenmill.request import Request


@dataclass
class SamplingBatch:
    """Row i describes the request that samples from row i of the step's logits.

    A field is None when no row needs that feature, so the sampler skips it; an all-greedy batch
    without processors costs one argmax. Token ids were checked against the vocabulary by
    ``SamplingParams.check_token_ids`` in the front end; ids outside it are dropped here so that a
    bad id can never fault the device.
    """

    request_ids: list[str]
    vocab_size: int
    all_greedy: bool
    greedy: torch.Tensor | None  # [N] bool, only in a batch mixing greedy and random rows
    temperature: torch.Tensor | None  # [N] float (1.0 on greedy rows); None when no row scales
    min_p: torch.Tensor | None
    top_k: torch.Tensor | None  # [N] long, vocab_size where off
    max_top_k: int
    top_p: torch.Tensor | None
    penalties: Penalties | None
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # rows, token ids, values
    allowed: tuple[torch.Tensor, torch.Tensor] | None  # rows, [R, V] bool mask of disallowed tokens
    banned: tuple[torch.Tensor, torch.Tensor] | None  # rows, token ids (bad words, early stop tokens)
    grammar: tuple[list[int], torch.Tensor] | None  # rows, xgrammar bitmask [R, ceil(V / 32)] int32 of allowed tokens
    seeds: list[int | None]  # per row; None on greedy and unseeded rows
    num_logprobs: list[int | None]

    @property
    def num_rows(self) -> int:
        return len(self.request_ids)

    @property
    def needs_processing(self) -> bool:
        """Whether any logits processor (bias, masks, penalties) runs before sampling."""
        return any(x is not None for x in (self.penalties, self.logit_bias, self.allowed, self.banned, self.grammar))

    @classmethod
    def from_requests(cls, requests: Sequence[Request], vocab_size: int, device: torch.device | str) -> SamplingBatch:
        """Gather the settings of ``requests`` (in the order of the logits rows) onto ``device``."""
        device = torch.device(device)
        params = [r.sampling_params for r in requests]
        greedy = [p.greedy for p in params]

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        def longs(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        random_params = [p for p, g in zip(params, greedy, strict=True) if not g]
        temperature = min_p = top_k = top_p = None
        max_top_k = 0
        if any(p.temperature != 1.0 for p in random_params):
            temperature = floats([1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)])
        if any(p.min_p > 0.0 for p in random_params):
            min_p = floats([0.0 if g else p.min_p for p, g in zip(params, greedy, strict=True)])
        row_top_k = [
            vocab_size if g or p.top_k <= 0 else min(p.top_k, vocab_size) for p, g in zip(params, greedy, strict=True)
        ]
        if any(k < vocab_size for k in row_top_k):
            top_k = longs(row_top_k)
            max_top_k = max(k for k in row_top_k if k < vocab_size)
        if any(p.top_p < 1.0 for p in random_params):
            top_p = floats([1.0 if g else p.top_p for p, g in zip(params, greedy, strict=True)])

        return cls(
            request_ids=[r.request_id for r in requests],
            vocab_size=vocab_size,
            all_greedy=all(greedy),
            greedy=torch.tensor(greedy, device=device) if any(greedy) and not all(greedy) else None,
            temperature=temperature,
            min_p=min_p,
            top_k=top_k,
            max_top_k=max_top_k,
            top_p=top_p,
            penalties=_penalties(requests, vocab_size, device),
            logit_bias=_logit_bias(requests, vocab_size, device),
            allowed=_allowed(requests, vocab_size, device),
            banned=_banned(requests, vocab_size, device),
            grammar=_grammar(requests, vocab_size),
            seeds=[None if g else p.seed for p, g in zip(params, greedy, strict=True)],
            num_logprobs=[p.logprobs for p in params],
        )


def _penalties(requests: Sequence[Request], vocab_size: int, device: torch.device) -> Penalties | None:
    params = [r.sampling_params for r in requests]
    active = [p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0 for p in params]
    if not any(active):
        return None
    needs_prompt = any(p.repetition_penalty != 1.0 for p in params)
    return Penalties.build(
        presence=[p.presence_penalty for p in params],
        frequency=[p.frequency_penalty for p in params],
        repetition=[p.repetition_penalty for p in params],
        output_histories=[r.output_token_ids if a else () for r, a in zip(requests, active, strict=True)],
        prompt_histories=[r.prompt_token_ids if a else () for r, a in zip(requests, active, strict=True)]
        if needs_prompt
        else None,
        vocab_size=vocab_size,
        device=device,
    )


def _logit_bias(
    requests: Sequence[Request], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    rows, token_ids, values = [], [], []
    for row, request in enumerate(requests):
        for token_id, value in (request.sampling_params.logit_bias or {}).items():
            if 0 <= token_id < vocab_size:
                rows.append(row)
                token_ids.append(token_id)
                values.append(value)
    if not rows:
        return None
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(token_ids, dtype=torch.long, device=device),
        torch.tensor(values, dtype=torch.float32, device=device),
    )


def _allowed(
    requests: Sequence[Request], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    rows = [row for row, r in enumerate(requests) if r.sampling_params.allowed_token_ids is not None]
    if not rows:
        return None
    mask = torch.ones(len(rows), vocab_size, dtype=torch.bool)
    for local_row, row in enumerate(rows):
        allowed = [t for t in requests[row].sampling_params.allowed_token_ids if 0 <= t < vocab_size]
        mask[local_row, allowed] = False
    return torch.tensor(rows, dtype=torch.long, device=device), mask.to(device)


def _banned(
    requests: Sequence[Request], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    rows, token_ids = [], []
    for row, request in enumerate(requests):
        banned = _banned_token_ids(request)
        banned = {t for t in banned if 0 <= t < vocab_size}
        rows += [row] * len(banned)
        token_ids += sorted(banned)
    if not rows:
        return None
    return torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(token_ids, dtype=torch.long, device=device)


def _banned_token_ids(request: Request) -> set[int]:
    """Tokens this request may not sample next: the last token of every bad word whose other
    tokens end the output, and the stop tokens (EOS unless ignore_eos) before ``min_tokens``."""
    params = request.sampling_params
    output = request.output_token_ids
    banned: set[int] = set()
    for word in params.bad_words_token_ids or ():
        prefix = word[:-1]
        if not prefix or (len(output) >= len(prefix) and output[len(output) - len(prefix) :] == prefix):
            banned.add(word[-1])
    if len(output) < params.min_tokens:
        banned.update(params.stop_token_ids)
        if not params.ignore_eos:
            banned.update(request.eos_token_ids)
    return banned


def _grammar(requests: Sequence[Request], vocab_size: int) -> tuple[list[int], torch.Tensor] | None:
    """The rows under a structured-output grammar and xgrammar's bitmask of allowed next tokens, one
    row per request (only the listed rows are filled and applied)."""
    rows = [row for row, r in enumerate(requests) if r.grammar is not None and not r.grammar.is_terminated]
    if not rows:
        return None
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(requests), vocab_size)
    for row in rows:
        requests[row].grammar.fill_mask(bitmask, row)
    return rows, bitmask
