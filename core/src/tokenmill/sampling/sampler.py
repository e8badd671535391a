"""Sampler: turns one step's logits into next tokens (and their logprobs) for every sampling row."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from tokenmill.sampling.batch import SamplingBatch
from tokenmill.sampling.greedy import GreedyArgmax
from tokenmill.sampling.logprobs import logprobs_entries
from tokenmill.sampling.truncation import apply_min_p, apply_top_k_top_p
from tokenmill.wire import LogprobsEntry

_NEG_INF = float("-inf")


@dataclass
class SamplerOutput:
    """Row i's next token and, when its request asked for logprobs, their entry (else None)."""

    token_ids: list[int]
    logprobs: list[LogprobsEntry | None]


class Sampler:
    """Vectorised sampling over the batch, on whatever device the logits live.

    Order (vLLM's): logit bias, allowed tokens, bad words and min_tokens masks -> penalties ->
    structured-output grammar mask -> temperature -> min_p -> top_k -> top_p -> sample. Greedy rows take the argmax of the processed
    logits. Random rows race exponentials: token = argmax(probs / q), q ~ Exp(1); a seeded row draws
    its q from its own generator, so it gets the same tokens alone or in any batch. Logprobs are
    those of the raw model distribution, taken before any processing (vLLM's "raw_logprobs").

    The sampler keeps one generator per seeded request; call ``release`` with finished request ids.
    Greedy rows take their argmax from ``greedy`` (the runner's, which asks the platform's kernels).
    """

    def __init__(self, greedy: GreedyArgmax | None = None) -> None:
        self._generators: dict[str, torch.Generator] = {}
        self._greedy = greedy if greedy is not None else GreedyArgmax()

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Sample one token per row of ``logits`` [N, V] (rows in ``batch`` order)."""
        assert logits.shape[0] == batch.num_rows, (logits.shape, batch.num_rows)
        raw = logits.float()
        processed = self._process(raw.clone(), batch) if batch.needs_processing else raw
        if batch.all_greedy:
            sampled = self._greedy.argmax(processed)
        else:
            sampled = self._sample(processed, batch)
        token_ids = sampled.tolist()
        return SamplerOutput(token_ids=token_ids, logprobs=self._logprobs(raw, sampled, batch))

    def release(self, request_ids: Iterable[str]) -> None:
        """Forget the generators of finished requests."""
        for request_id in request_ids:
            self._generators.pop(request_id, None)

    @staticmethod
    def _process(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        if batch.logit_bias is not None:
            rows, token_ids, values = batch.logit_bias
            logits.index_put_((rows, token_ids), values, accumulate=True)
        if batch.allowed is not None:
            rows, disallowed = batch.allowed
            logits[rows] = logits[rows].masked_fill(disallowed, _NEG_INF)
        if batch.banned is not None:
            rows, token_ids = batch.banned
            logits[rows, token_ids] = _NEG_INF
        if batch.penalties is not None:
            logits = batch.penalties.apply(logits)
        if batch.grammar is not None:
            logits = _apply_grammar(logits, *batch.grammar)
        return logits

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        greedy_ids = self._greedy.argmax(logits) if batch.greedy is not None else None
        if batch.temperature is not None:
            logits = logits / batch.temperature.unsqueeze(1)
        if batch.min_p is not None:
            logits = apply_min_p(logits, batch.min_p)
        logits = apply_top_k_top_p(logits, batch.top_k, batch.top_p, batch.max_top_k)
        probs = torch.softmax(logits, dim=-1)
        sampled = (probs / self._exponentials(probs, batch)).argmax(dim=-1)
        if greedy_ids is not None:
            sampled = torch.where(batch.greedy, greedy_ids, sampled)
        return sampled

    def _exponentials(self, probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Exp(1) noise, one value per token, as -log(U): on CPUs uniform_ + log beats exponential_."""
        uniform = torch.empty_like(probs)
        seeded_rows = [row for row, seed in enumerate(batch.seeds) if seed is not None]
        if len(seeded_rows) < batch.num_rows:
            uniform.uniform_()  # unseeded rows share the device's default generator
        for row in seeded_rows:
            generator = self._generator(batch.request_ids[row], batch.seeds[row], probs.device)
            if generator.device == probs.device:
                uniform[row].uniform_(generator=generator)
            else:
                uniform[row] = torch.empty(probs.shape[1]).uniform_(generator=generator).to(probs.device)
        # U in [0, 1) gives q in (0, inf]; the floor guards a device whose uniform_ can return 1.0,
        # so probs / q is never NaN and masked tokens (probability 0) can never win
        return uniform.log_().neg_().clamp_min_(torch.finfo(probs.dtype).tiny)

    def _generator(self, request_id: str, seed: int, device: torch.device) -> torch.Generator:
        generator = self._generators.get(request_id)
        if generator is None:
            try:
                generator = torch.Generator(device=device)
            except RuntimeError:  # a device without its own generators draws on the host
                generator = torch.Generator()
            generator.manual_seed(seed)
            self._generators[request_id] = generator
        return generator

    @staticmethod
    def _logprobs(raw: torch.Tensor, sampled: torch.Tensor, batch: SamplingBatch) -> list[LogprobsEntry | None]:
        rows = [row for row, k in enumerate(batch.num_logprobs) if k is not None]
        result: list[LogprobsEntry | None] = [None] * batch.num_rows
        if not rows:
            return result
        index = torch.tensor(rows, dtype=torch.long, device=raw.device)
        selected = raw if len(rows) == batch.num_rows else raw[index]
        chosen = sampled if len(rows) == batch.num_rows else sampled[index]
        entries = logprobs_entries(selected, chosen, [batch.num_logprobs[row] for row in rows])
        for row, entry in zip(rows, entries, strict=True):
            result[row] = entry
        return result


def _apply_grammar(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    """-inf on the tokens each listed row's bitmask row leaves out (xgrammar's packed int32 bits, one
    bitmask row per logits row)."""
    import xgrammar

    if logits.device.type == "cpu" and logits.dtype is torch.float32 and logits.is_contiguous():
        xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
        return logits
    vocab = logits.shape[1]
    index = torch.tensor(rows, device=logits.device)
    words = bitmask.to(logits.device).index_select(0, index)
    bits = words.unsqueeze(-1) >> torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = (bits & 1).bool().reshape(len(rows), -1)[:, :vocab]
    logits[index] = logits[index].masked_fill(~allowed, _NEG_INF)
    return logits
