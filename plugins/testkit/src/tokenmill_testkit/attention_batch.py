"""Building an ``AttentionBatch`` the way the engine's model runner does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenmill.plugin_api import AttentionBatch


@dataclass(frozen=True)
class ScheduledRequest:
    """One request in one step: its cache blocks, tokens already cached, and new tokens now."""

    block_table: tuple[int, ...]  # every block the request owns, in position order
    context_len: int
    query_len: int

    @property
    def seq_len(self) -> int:
        return self.context_len + self.query_len

    def slots(self, block_size: int) -> list[int]:
        """Cache slot of each new token: ``block_id * block_size + offset``."""
        positions = range(self.context_len, self.seq_len)
        return [self.block_table[p // block_size] * block_size + p % block_size for p in positions]


def make_attention_batch(requests: Sequence[ScheduledRequest], block_size: int, device: Any = "cpu") -> AttentionBatch:
    """The flattened step for ``requests`` in batch order, tensors on ``device``, from
    ``AttentionBatch.build`` as the engine's runner makes it.

    Block tables hold each request's blocks up to its ``seq_len`` and are padded with 0 to the
    longest one, as the engine does; ``slot_mapping`` lists the slot of every new token in order.
    """
    if not requests:
        raise ValueError("a step schedules at least one request")
    for request in requests:
        if request.query_len < 1:
            raise ValueError(f"every scheduled request has at least one new token, got {request}")
        if len(request.block_table) * block_size < request.seq_len:
            raise ValueError(f"{len(request.block_table)} blocks of {block_size} cannot hold {request.seq_len} tokens")
    tables = [list(r.block_table[: -(-r.seq_len // block_size)]) for r in requests]
    return AttentionBatch.build([r.query_len for r in requests], [r.context_len for r in requests], tables,
                                block_size, device=device)
