"""NgramProposer: draft tokens by prompt lookup (no model), as vLLM's ``ngram`` method."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenmill.spec_decode.proposer import DraftSlot


class NgramProposer:
    """Proposes the tokens that followed the latest earlier occurrence of the sequence's suffix,
    trying the longest suffix (``max_n`` tokens) first, down to ``min_n``."""

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, slots: Sequence[DraftSlot]) -> dict[str, list[int]]:
        """Draft tokens for each slot's request (from its own tokens); requests without a match are left out."""
        drafts = {}
        for slot in slots:
            found = self.lookup(slot.request.all_token_ids, slot.num_tokens)
            if found:
                drafts[slot.request.request_id] = found
        return drafts

    def lookup(self, token_ids: Sequence[int], max_tokens: int | None = None) -> list[int]:
        """Up to ``min(num_speculative_tokens, max_tokens)`` tokens; empty when no suffix recurs."""
        limit = self.num_speculative_tokens if max_tokens is None else min(self.num_speculative_tokens, max_tokens)
        tokens = np.asarray(token_ids, dtype=np.int64)
        size = len(tokens)
        if limit <= 0 or size < self.min_n + 1:
            return []
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            suffix = tokens[size - n:]
            windows = np.lib.stride_tricks.sliding_window_view(tokens[: size - 1], n)
            starts = np.flatnonzero((windows == suffix).all(axis=1))
            if starts.size:
                follow = int(starts[-1]) + n
                return tokens[follow: follow + limit].tolist()
        return []
