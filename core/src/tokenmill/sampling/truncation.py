"""Truncation of the sampling distribution: min_p, top_k and top_p masks over [N, V] logits.

Every function returns logits where the removed tokens are ``-inf``; a row whose setting is off
(min_p 0, top_k equal to the vocabulary size, top_p 1) is left unchanged. Tokens tied with the last
kept one are kept too, so the result never depends on how a sort orders equal values.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")
# top_p is resolved among the best 64, else 1024 tokens when they hold the needed mass (the usual
# case), which avoids a full sort of the vocabulary (slow on CPUs); otherwise the vocabulary is sorted
_TOP_P_CANDIDATES = (64, 1024)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Remove tokens whose probability is below ``min_p`` times the row's top probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, _NEG_INF)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None, max_top_k: int = 0
) -> torch.Tensor:
    """Keep the ``top_k`` largest logits, then the smallest head of what remains whose probability
    mass reaches ``top_p``: a token stays when the tokens better than it hold less than ``top_p``.

    ``max_top_k`` is the largest k of the rows that use top_k, known on the host so that no device
    sync is needed for it; rows without top_k carry k = vocabulary size.
    """
    if top_k is not None:
        logits = _apply_top_k(logits, top_k, max_top_k)
    if top_p is not None:
        logits = _apply_top_p(logits, top_p)
    return logits


def _apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    vocab_size = logits.shape[-1]
    top_k = top_k.clamp(1, vocab_size)
    max_k = min(max(max_top_k, 1), vocab_size)
    top_values = logits.topk(max_k, dim=-1).values
    kth_value = top_values.gather(1, (top_k - 1).clamp(max=max_k - 1).unsqueeze(1))
    kth_value = torch.where(top_k.unsqueeze(1) >= vocab_size, _NEG_INF, kth_value)
    return logits.masked_fill(logits < kth_value, _NEG_INF)


def _apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    vocab_size = logits.shape[-1]
    top_p = top_p.unsqueeze(1)
    log_total = torch.logsumexp(logits, dim=-1, keepdim=True)

    def head(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        values = (
            logits.topk(count, dim=-1).values if count < vocab_size else logits.sort(dim=-1, descending=True).values
        )
        probs = torch.exp(values - log_total)
        return values, probs.cumsum(dim=-1) - probs  # the mass of the tokens before each one

    for count in (*_TOP_P_CANDIDATES, vocab_size):
        values, mass_before = head(min(count, vocab_size))
        if count >= vocab_size:
            break
        head_mass = mass_before[:, -1:] + torch.exp(values[:, -1:] - log_total)
        if bool(((head_mass >= top_p) | (top_p >= 1.0)).all()):
            break
    num_kept = (mass_before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)
    threshold = values.gather(1, num_kept - 1)
    threshold = torch.where(top_p >= 1.0, _NEG_INF, threshold)
    return logits.masked_fill(logits < threshold, _NEG_INF)
