"""KVCacheManager: each request's block table, prefix-cache lookups, allocation, forking and freeing."""

from __future__ import annotations

from collections.abc import Sequence

from tokenmill.kv_cache.block import KVCacheBlock
from tokenmill.kv_cache.block_hash import BlockHash, extend_block_hashes
from tokenmill.kv_cache.block_pool import BlockPool
from tokenmill.kv_cache.prefix_cache_stats import PrefixCacheStats
from tokenmill.request import Request


class KVCacheManager:
    """Maps requests to blocks of ``block_size`` token slots in a pool of ``num_blocks`` blocks.

    Token ``i`` of a request lives in block ``table[i // block_size]`` at offset ``i % block_size``.
    A request's table only grows while it holds blocks (append-only, so the runner can update block
    tables incrementally); ``free`` releases all of it. Only full blocks are shared, and a shared block
    is never written again: computed ones, and within the step being planned the ones that step
    completes (``begin_step``).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_pool = BlockPool(num_blocks, enable_prefix_caching)
        self.prefix_cache_stats = PrefixCacheStats()
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading table blocks already offered to the cache
        self._in_flight: dict[BlockHash, KVCacheBlock] = {}  # full blocks the step being planned completes

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    def usage(self) -> float:
        """Fraction of the usable blocks in use."""
        return self.block_pool.usage()

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a live list: copy it to keep a snapshot)."""
        return self.req_to_block_ids.get(request_id, [])

    def begin_step(self) -> None:
        """Start planning a step: forget the blocks the last step completed (``allocate_slots`` offers
        the blocks a step completes to the requests planned after it in the same step)."""
        self._in_flight.clear()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of a request without blocks: (blocks, number of tokens).

        Blocks that a request planned earlier in this step completes count as cached: every layer
        writes the step's keys and values before any of its rows attends, so a request that starts
        after them reads them like cached ones (a burst of prompts with one system prompt computes it
        once). The last token is never covered, so at least one token is computed and yields logits; a
        request that wants prompt logprobs gets no hit. Nothing is reserved: pass the blocks to
        ``allocate_slots`` in the same step.
        """
        if not self.enable_prefix_caching or request.skip_reading_prefix_cache:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        self._hash_full_blocks(request, max_hit_blocks)
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                block = self._in_flight.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def get_fork_blocks(self, parent: Request, child: Request) -> tuple[list[KVCacheBlock], int]:
        """The parent's full computed blocks whose tokens the child starts with: (blocks, tokens)."""
        bs = self.block_size
        parent_blocks = self.req_to_blocks.get(parent.request_id, [])
        limit = min(parent.num_computed_tokens // bs, (child.num_tokens - 1) // bs, len(parent_blocks))
        num_shared = 0
        while num_shared < limit:
            start = num_shared * bs
            if parent.all_token_ids[start : start + bs] != child.all_token_ids[start : start + bs]:
                break
            num_shared += 1
        return parent_blocks[:num_shared], num_shared * bs

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock] = ()
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed ones; False if it cannot.

        ``new_computed_blocks`` (from ``get_computed_blocks`` or ``get_fork_blocks``, for a request
        without blocks) are shared rather than allocated; the caller then advances
        ``request.num_computed_tokens`` past them. On False nothing changed.
        """
        request_id = request.request_id
        block_size = self.block_size
        table = self.req_to_blocks.get(request_id)
        if table is not None:  # a running request: no sharing, usually no new block either
            assert not new_computed_blocks, "computed blocks are only shared into a new table"
            num_new_blocks = -(-(request.num_computed_tokens + num_new_tokens) // block_size) - len(table)
            if num_new_blocks > 0:
                if num_new_blocks > self.block_pool.num_free_blocks:
                    return False
                self._append_blocks(request_id, self.block_pool.get_new_blocks(num_new_blocks))
            self._offer_in_flight(request, request.num_computed_tokens, num_new_tokens)
            return True

        num_computed = request.num_computed_tokens + len(new_computed_blocks) * block_size
        num_required = -(-(num_computed + num_new_tokens) // block_size)
        num_new_blocks = max(0, num_required - len(new_computed_blocks))
        num_revived = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_new_blocks > self.block_pool.num_free_blocks - num_revived:
            return False
        self.req_to_blocks[request_id] = []
        self.req_to_block_ids[request_id] = []
        self.num_cached_blocks[request_id] = len(new_computed_blocks)
        if self.enable_prefix_caching:
            self.prefix_cache_stats.record(request.num_tokens, len(new_computed_blocks) * block_size)
        self.block_pool.touch(new_computed_blocks)
        self._append_blocks(request_id, [*new_computed_blocks, *self.block_pool.get_new_blocks(num_new_blocks)])
        self._offer_in_flight(request, num_computed, num_new_tokens)
        return True

    def fork(self, parent: Request, child: Request) -> int:
        """Give a child without blocks the parent's full computed blocks it shares; returns its tokens.

        The child's ``num_computed_tokens`` becomes that count; the partial last block is not shared
        (the child recomputes it). Works without prefix caching: this is how n > 1 samples share
        their prompt.
        """
        assert child.request_id not in self.req_to_blocks, f"{child.request_id} already has blocks"
        assert child.num_computed_tokens == 0, f"{child.request_id} has computed tokens but no blocks"
        blocks, num_tokens = self.get_fork_blocks(parent, child)
        allocated = self.allocate_slots(child, 0, blocks)
        assert allocated, "sharing blocks that are in use needs no free blocks"
        child.num_computed_tokens = num_tokens
        return num_tokens

    def cache_blocks(self, request: Request) -> None:
        """Offer the request's newly full, computed blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        request_id = request.request_id
        table = self.req_to_blocks.get(request_id)
        if table is None:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(table))
        start = self.num_cached_blocks[request_id]
        if num_full <= start:
            return
        self._hash_full_blocks(request, num_full)
        self.block_pool.cache_full_blocks(table[start:num_full], request.block_hashes[start:num_full])
        self.num_cached_blocks[request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so its last blocks are evicted before its first."""
        request_id = request.request_id
        table = self.req_to_blocks.pop(request_id, None)
        if table is None:
            return
        del self.req_to_block_ids[request_id]
        del self.num_cached_blocks[request_id]
        self.block_pool.free_blocks(reversed(table))
        self._in_flight.clear()  # a request freed while a step is planned (preempted) computes nothing in it

    def reset_prefix_cache(self) -> int:
        """Forget all cached content and zero the stats; returns how many blocks were uncached."""
        self.prefix_cache_stats.reset()
        return self.block_pool.reset_prefix_cache()

    def _append_blocks(self, request_id: str, blocks: list[KVCacheBlock]) -> None:
        self.req_to_blocks[request_id].extend(blocks)
        self.req_to_block_ids[request_id].extend(block.block_id for block in blocks)

    def _offer_in_flight(self, request: Request, num_computed: int, num_new_tokens: int) -> None:
        """Offer the full blocks of known tokens that computing ``num_new_tokens`` after ``num_computed``
        completes (draft tokens past the request's tokens are not known yet)."""
        if not self.enable_prefix_caching:
            return
        start, end = num_computed // self.block_size, min(num_computed + num_new_tokens, request.num_tokens) // self.block_size
        if end <= start:
            return
        self._hash_full_blocks(request, end)
        table = self.req_to_blocks[request.request_id]
        for index in range(start, end):
            self._in_flight.setdefault(request.block_hashes[index], table[index])

    def _hash_full_blocks(self, request: Request, num_blocks: int) -> None:
        if len(request.block_hashes) < num_blocks:
            extend_block_hashes(
                request.block_hashes, request.all_token_ids, self.block_size, num_blocks, request.cache_salt
            )
