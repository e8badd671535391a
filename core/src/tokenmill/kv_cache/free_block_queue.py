"""FreeBlockQueue: the free blocks in eviction order, as an O(1) doubly linked list."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenmill.kv_cache.block import KVCacheBlock


class FreeBlockQueue:
    """Free blocks, next victim first. Blocks link to each other, so removal from the middle is O(1).

    The head is evicted first. Freed blocks with cached content are appended at the tail (least
    recently used first); freed blocks without content are pushed at the head, so they are reused
    before any block whose K/V a prefix-cache hit could still revive.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()) -> None:
        self._head = KVCacheBlock(-1)  # sentinels: the list is never empty, so links need no checks
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def append(self, block: KVCacheBlock) -> None:
        self._insert_after(self._tail.prev_free, block)

    def appendleft(self, block: KVCacheBlock) -> None:
        self._insert_after(self._head, block)

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"{block} is not in the free queue"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def _insert_after(self, anchor: KVCacheBlock, block: KVCacheBlock) -> None:
        assert block.prev_free is None and block.next_free is None, f"{block} is already in the free queue"
        nxt = anchor.next_free
        block.prev_free = anchor
        block.next_free = nxt
        anchor.next_free = block
        nxt.prev_free = block
        self.num_free_blocks += 1

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free
