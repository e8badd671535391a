"""The proposer contract: draft tokens for requests that speculate, one call per engine step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenmill.request import Request


@dataclass(frozen=True)
class DraftSlot:
    """One request to draft for: its last token is ``request.all_token_ids[-1]`` at position
    ``request.num_tokens - 1``; ``block_ids`` is its block table (room for the ``num_tokens`` drafts'
    K/V from that position on)."""

    request: Request
    block_ids: Sequence[int]
    num_tokens: int


class Proposer(Protocol):
    """Proposes up to ``slot.num_tokens`` draft tokens per request; a request may be left out."""

    def propose(self, slots: Sequence[DraftSlot]) -> dict[str, list[int]]:
        """Draft tokens by request id."""
        ...
