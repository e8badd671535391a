"""PagedHarness: paged attention driven without the engine, for testing attention backends and models.

A toy block allocator turns "feed these tokens to these sequences" into the flat step tensors and
AttentionBatch the model runner would build, and allocates per-layer KV caches, so a backend or a
model can be run step by step against the reference (core's tests and the plugins' use it).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from tokenmill.layers.context import AttentionContext
from tokenmill.plugin_api import AttentionBackend, AttentionBatch, AttentionSpec


@dataclass
class Step:
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    batch: AttentionBatch
    last_token_rows: list[int]  # row of each chunk's last token in the flat batch


class PagedHarness:
    """Sequences with block tables drawn at random from a pool (so blocks are never contiguous)."""

    def __init__(self, block_size: int = 16, num_blocks: int = 64, seed: int = 0, device: str = "cpu"):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.block_tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}

    def share_prefix(self, seq: Hashable, source: Hashable, num_tokens: int) -> None:
        """Start ``seq`` with the first ``num_tokens`` (whole blocks) of ``source`` already cached."""
        assert num_tokens % self.block_size == 0 and num_tokens <= self.lengths[source]
        self.block_tables[seq] = list(self.block_tables[source][: num_tokens // self.block_size])
        self.lengths[seq] = num_tokens

    def _grow(self, seq: Hashable, new_len: int) -> list[int]:
        table = self.block_tables.setdefault(seq, [])
        while len(table) * self.block_size < new_len:
            table.append(self.free.pop())
        return table

    def step(self, chunks: Sequence[tuple[Hashable, Sequence[int]]]) -> Step:
        """Feed ``token_ids`` to each ``seq`` after the tokens it already has; one flat batch."""
        ids, positions, query_lens, context_lens, tables, rows = [], [], [], [], [], []
        for seq, tokens in chunks:
            start = self.lengths.get(seq, 0)
            end = start + len(tokens)
            table = self._grow(seq, end)
            ids.extend(tokens)
            positions.extend(range(start, end))
            query_lens.append(len(tokens))
            context_lens.append(start)
            tables.append(table)
            rows.append(len(ids) - 1)
            self.lengths[seq] = end
        batch = AttentionBatch.build(query_lens, context_lens, tables, self.block_size, device=self.device)

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype, device=self.device)

        return Step(tensor(ids, torch.int64), tensor(positions, torch.int64), batch, rows)

    def allocate_caches(self, backend: AttentionBackend, specs: Sequence[AttentionSpec]) -> list[torch.Tensor]:
        """One cache per layer, filled with large finite garbage (as stale blocks of finished
        requests would be): slots a step must not read then spoil any output that reads them."""
        gen = torch.Generator(device="cpu").manual_seed(1234)
        caches = []
        for spec in specs:
            shape = backend.kv_cache_shape(self.num_blocks, self.block_size, spec.num_kv_heads, spec.head_size)
            garbage = (torch.randn(shape, generator=gen) * 100).clamp(-400, 400)
            caches.append(garbage.to(device=self.device, dtype=backend.kv_cache_torch_dtype(spec)))
        return caches

    def context(self, backend: AttentionBackend, caches: list[torch.Tensor], step: Step) -> AttentionContext:
        return AttentionContext(backend=backend, metadata=backend.plan(step.batch), kv_caches=caches)
