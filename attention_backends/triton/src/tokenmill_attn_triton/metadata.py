"""TritonAttentionMetadata: the per-step plan shared by every attention layer of one forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class QueryTiles:
    """The attention kernel's work list: program ``i`` handles query tokens
    ``start[i] : start[i] + block_q`` (local to its request) of request ``request[i]``."""

    block_q: int
    request: torch.Tensor  # int32 [num_tiles], on the device
    start: torch.Tensor  # int32 [num_tiles], on the device

    @property
    def num_tiles(self) -> int:
        return self.request.shape[0]


@dataclass
class TritonAttentionMetadata:
    """Device tensors of the step plus host-side sizes, so launches never sync with the device."""

    query_start_loc: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    slot_mapping: torch.Tensor  # int64 [T]
    query_lens_cpu: list[int]
    max_query_len: int
    max_seq_len: int
    num_tokens: int
    block_size: int
    _tiles: dict[int, QueryTiles] = field(default_factory=dict, repr=False)

    def query_tiles(self, block_q: int) -> QueryTiles:
        """The tile-to-request map for tiles of ``block_q`` query tokens; built on the host from
        ``query_lens_cpu`` the first time a layer asks for it in this step, then reused."""
        tiles = self._tiles.get(block_q)
        if tiles is None:
            tiles = self._build_tiles(block_q)
            self._tiles[block_q] = tiles
        return tiles

    def _build_tiles(self, block_q: int) -> QueryTiles:
        query_lens = torch.tensor(self.query_lens_cpu, dtype=torch.int64)
        tiles_per_request = (query_lens + block_q - 1) // block_q
        num_tiles = int(tiles_per_request.sum())
        request = torch.repeat_interleave(torch.arange(len(self.query_lens_cpu)), tiles_per_request)
        first_tile_of_request = torch.cumsum(tiles_per_request, 0) - tiles_per_request
        start = (torch.arange(num_tiles) - first_tile_of_request[request]) * block_q
        device = self.query_start_loc.device
        return QueryTiles(
            block_q=block_q,
            request=request.to(device=device, dtype=torch.int32, non_blocking=True),
            start=start.to(device=device, dtype=torch.int32, non_blocking=True),
        )
