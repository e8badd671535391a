"""Truncation of the sampling distribution: min_p, top_k and top_p masks over [N, V] logits.

Every function returns logits where the removed tokens are ``-inf``; a row whose setting is off
(min_p 0, top_k equal to the vocabulary size, top_p 1) is left unchanged.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Remove tokens whose probability is below ``min_p`` times the row's top probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, _NEG_INF)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None, max_top_k: int = 0
) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (ties at the k-th value kept), then the smallest head of
    the remaining distribution whose probability mass reaches ``top_p`` (the top token always stays).

    ``max_top_k`` is the largest k of the rows that use top_k, known on the host so that no device
    sync is needed; rows without top_k carry k = vocabulary size.
    """
    if top_p is None:
        return logits if top_k is None else _apply_top_k(logits, top_k, max_top_k)
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab_size = logits.shape[-1]
    if top_k is not None:
        kth_index = (vocab_size - top_k.clamp(1, vocab_size)).unsqueeze(1)
        kth_value = sorted_logits.gather(1, kth_index)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_value, _NEG_INF)
    # ascending order: a token goes when the mass of everything up to and including it is <= 1 - p,
    # i.e. when the mass of the strictly better tokens already reaches p
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1 - top_p.unsqueeze(1)
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    vocab_size = logits.shape[-1]
    top_k = top_k.clamp(1, vocab_size)
    max_k = min(max(max_top_k, 1), vocab_size)
    top_values = logits.topk(max_k, dim=-1).values
    kth_value = top_values.gather(1, (top_k - 1).clamp(max=max_k - 1).unsqueeze(1))
    kth_value = torch.where(top_k.unsqueeze(1) >= vocab_size, _NEG_INF, kth_value)
    return logits.masked_fill(logits < kth_value, _NEG_INF)
