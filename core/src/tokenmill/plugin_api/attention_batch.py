"""AttentionBatch: one step's requests flattened for attention, and ``AttentionBatch.build``, the one way to make one.

Every producer of a batch (the model runner's step inputs, its decode and prefill graphs, memory
profiling, the reference harness, the plugin testkit and plugin tests) calls ``build`` with the
per-request facts, so every field is derived the same way and the fields always agree:
``seq_lens = context_lens + query_lens``, ``query_start_loc`` their running sum from 0,
``num_tokens = sum(query_lens)``, the host lists mirroring the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any


@dataclass
class AttentionBatch:
    """The flattened step, shared by every layer. Tensors live on the compute device.

    ``B`` requests, ``T`` tokens in all. Request ``i`` owns query tokens
    ``query_start_loc[i]:query_start_loc[i+1]``; it had ``context_lens[i]`` tokens in the cache
    before this step and has ``seq_lens[i] = context_lens[i] + query_len`` after it. The
    ``*_cpu`` lists mirror the tensors so a backend can plan without a device sync. Make one with
    ``AttentionBatch.build``.
    """

    query_start_loc: Any  # int32 [B + 1]
    seq_lens: Any  # int32 [B]
    context_lens: Any  # int32 [B]
    block_tables: Any  # int32 [B, max_blocks]; padded with 0
    slot_mapping: Any  # int64 [T] (or longer, its tail padding): block_id * block_size + offset of each new token
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    max_query_len: int
    max_seq_len: int
    num_tokens: int
    block_size: int

    @classmethod
    def build(cls, query_lens: Sequence[int], context_lens: Sequence[int], block_tables: Any, block_size: int, *,
              slot_mapping: Any = None, device: Any = None,
              length_tensors: tuple[Any, Any, Any] | None = None) -> AttentionBatch:
        """The batch of a step whose request ``i`` feeds ``query_lens[i]`` new tokens after
        ``context_lens[i]`` cached ones (host integers: lists, tuples or 1-D arrays).

        ``block_tables``: each request's block ids in position order, as lists (padded here with 0,
        the null block, to the longest) or as an int32 [B, W] array or tensor. ``slot_mapping``: the
        cache slot of every new token, request after request (it may run past ``num_tokens`` with
        padding slots); when None it is derived from the tables at each token's position.
        ``length_tensors``: ``(query_start_loc, seq_lens, context_lens)`` already on the device and
        holding what the lengths say (a graph's static buffers, which a captured plan keeps reading);
        derived from the lengths when None. Arrays become contiguous tensors on ``device`` (default: the
        tables' device); a contiguous tensor already there with the field's dtype is used as is, not copied.
        """
        import torch

        query = _int_list(query_lens)
        context = _int_list(context_lens)
        if len(query) != len(context):
            raise ValueError(f"{len(query)} query lengths but {len(context)} context lengths")
        seq = [c + q for c, q in zip(context, query, strict=True)]
        if device is None:
            device = getattr(block_tables, "device", None)
        if isinstance(block_tables, (list, tuple)):
            width = max((len(table) for table in block_tables), default=0)
            block_tables = [[*table, *([0] * (width - len(table)))] for table in block_tables]
            block_tables = torch.tensor(block_tables, dtype=torch.int32, device=device).reshape(len(query), width)
        tables = torch.as_tensor(block_tables, dtype=torch.int32, device=device).contiguous()
        starts = [0, *accumulate(query)]
        if length_tensors is None:
            length_tensors = (torch.tensor(starts, dtype=torch.int32, device=tables.device),
                              torch.tensor(seq, dtype=torch.int32, device=tables.device),
                              torch.tensor(context, dtype=torch.int32, device=tables.device))
        if slot_mapping is None:
            slot_mapping = _slots(tables, query, context, block_size)
        return cls(
            query_start_loc=length_tensors[0], seq_lens=length_tensors[1], context_lens=length_tensors[2],
            block_tables=tables,
            slot_mapping=torch.as_tensor(slot_mapping, dtype=torch.int64, device=tables.device).contiguous(),
            query_lens_cpu=query, seq_lens_cpu=seq, max_query_len=max(query, default=0),
            max_seq_len=max(seq, default=0), num_tokens=starts[-1], block_size=block_size)

    @property
    def num_requests(self) -> int:
        """How many requests the step holds."""
        return len(self.seq_lens_cpu)

    @property
    def is_pure_decode(self) -> bool:
        """True when every request feeds exactly one token (a decode-only step)."""
        return self.max_query_len == 1


def _int_list(values: Sequence[int]) -> list[int]:
    """Host integers as a list of Python ints (an array's ``tolist``, else element by element)."""
    return values.tolist() if hasattr(values, "tolist") else [int(v) for v in values]


def _slots(tables: Any, query: list[int], context: list[int], block_size: int) -> Any:
    """int64 [T]: ``tables[i, p // block_size] * block_size + p % block_size`` for every new token's
    position ``p`` (``context[i]`` up to ``context[i] + query[i]``) of every request ``i``."""
    import torch

    device = tables.device
    counts = torch.tensor(query, dtype=torch.int64, device=device)
    request = torch.repeat_interleave(torch.arange(len(query), device=device), counts)
    first = torch.tensor(context, dtype=torch.int64, device=device) - (counts.cumsum(0) - counts)
    positions = torch.arange(int(counts.sum()), device=device) + first[request]
    return tables[request, positions // block_size].long() * block_size + positions % block_size
