"""BlockPool: every KV-cache block, their reference counts, the free queue and the prefix-cache map."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenmill.kv_cache.block import KVCacheBlock
from tokenmill.kv_cache.block_hash import BlockHash
from tokenmill.kv_cache.free_block_queue import FreeBlockQueue

NULL_BLOCK_ID = 0


class BlockPool:
    """Owns blocks ``0 .. num_blocks-1``. Block 0 is the null block: never allocated, never freed, so
    the runner can pad block tables with 0 and padded slots never alias a live request's K/V.

    Allocation takes the head of the free queue; a cached block taken that way loses its hash (its
    K/V is about to be overwritten). ``cached_blocks`` maps a hash to the one block holding that
    content; a second block that computes the same content stays uncached, so block tables never
    have to be rewritten.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks (one is the reserved null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[NULL_BLOCK_ID]
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached_blocks: dict[BlockHash, KVCacheBlock] = {}

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        """Fraction of the usable blocks held by at least one request (cached free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the head of the free queue, each with ``ref_cnt == 1``."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {self.num_free_blocks} are free")
        blocks = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_blocks.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add a reference to each block (a prefix hit or a fork); free ones leave the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks reaching zero join the free queue in this order."""
        for block in ordered_blocks:
            assert block.ref_cnt > 0 and block is not self.null_block, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[BlockHash]) -> None:
        """Register full, computed blocks under their content hashes (no-op with caching off)."""
        if not self.enable_caching:
            return
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            if block.block_hash is not None or block_hash in self.cached_blocks:
                continue
            block.block_hash = block_hash
            self.cached_blocks[block_hash] = block

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash (blocks in use keep their K/V, just not shareable). Returns how many.

        Free blocks that lose their hash move to the head of the free queue in block order, where
        ``free_blocks`` puts uncached blocks: allocation reuses them before blocks never used, whose pages
        a platform may back only at their first write, in the middle of a step."""
        num_evicted = len(self.cached_blocks)
        released = sorted((block for block in self.cached_blocks.values() if block.ref_cnt == 0),
                          key=lambda block: block.block_id, reverse=True)
        for block in self.cached_blocks.values():
            block.block_hash = None
        self.cached_blocks.clear()
        for block in released:
            self.free_queue.remove(block)
            self.free_queue.appendleft(block)
        return num_evicted

    def _evict(self, block: KVCacheBlock) -> None:
        if self.cached_blocks.get(block.block_hash) is block:
            del self.cached_blocks[block.block_hash]
        block.block_hash = None
