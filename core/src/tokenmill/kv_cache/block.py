"""KVCacheBlock: one fixed-size page of the paged KV cache, as the allocator sees it."""

from __future__ import annotations


class KVCacheBlock:
    """A block id with its reference count, its content hash once cached, and free-list links.

    ``ref_cnt`` is the number of block tables holding the block. A block with ``ref_cnt == 0`` sits
    in the free queue (``prev_free``/``next_free`` link it there); if it still has a ``block_hash``
    its K/V can be revived by a prefix-cache hit until the block is reallocated.
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        cached = self.block_hash.hex()[:8] if self.block_hash is not None else None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={cached})"
