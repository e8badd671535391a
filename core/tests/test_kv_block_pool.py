"""FreeBlockQueue and BlockPool: O(1) free list, reference counts, eviction order, the null block."""

import pytest

from tokenmill.kv_cache import NULL_BLOCK_ID, BlockPool, FreeBlockQueue, KVCacheBlock


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def fake_hash(i: int) -> bytes:
    return i.to_bytes(32, "little")


def test_free_queue_append_popleft_remove_in_any_position():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert ids(queue) == [0, 1, 2, 3, 4] and len(queue) == 5
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert ids(queue) == [1, 3] and len(queue) == 2
    queue.append(blocks[4])
    queue.appendleft(blocks[0])
    assert ids(queue) == [0, 1, 3, 4]
    assert queue.popleft() is blocks[0]
    assert ids(queue) == [1, 3, 4]
    for _ in range(3):
        queue.popleft()
    with pytest.raises(ValueError):
        queue.popleft()
    assert len(queue) == 0 and list(queue) == []


def test_free_queue_rejects_double_insert():
    block = KVCacheBlock(0)
    queue = FreeBlockQueue([block])
    with pytest.raises(AssertionError):
        queue.append(block)


def test_null_block_is_reserved():
    pool = BlockPool(4)
    assert pool.null_block.block_id == NULL_BLOCK_ID
    assert pool.num_usable_blocks == 3 and pool.num_free_blocks == 3
    got = pool.get_new_blocks(3)
    assert NULL_BLOCK_ID not in ids(got)
    assert all(b.ref_cnt == 1 for b in got)
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)


def test_ref_counts_and_usage():
    pool = BlockPool(5)
    a, b = pool.get_new_blocks(2)
    assert pool.usage() == pytest.approx(0.5)
    pool.touch([a])
    assert a.ref_cnt == 2
    pool.free_blocks([a, b])
    assert a.ref_cnt == 1 and b.ref_cnt == 0
    assert pool.num_free_blocks == 3
    pool.free_blocks([a])
    assert pool.num_free_blocks == 4 and pool.usage() == 0.0
    with pytest.raises(AssertionError, match="double free"):
        pool.free_blocks([a])


def test_uncached_free_blocks_are_reused_before_cached_ones():
    pool = BlockPool(5)
    a, b, c, d = pool.get_new_blocks(4)
    pool.cache_full_blocks([a, b], [fake_hash(1), fake_hash(2)])
    pool.free_blocks([b, a, c, d])  # c, d have no content worth keeping
    assert ids(pool.free_queue) == [d.block_id, c.block_id, b.block_id, a.block_id]
    first_two = pool.get_new_blocks(2)
    assert set(ids(first_two)) == {c.block_id, d.block_id}
    assert pool.get_cached_block(fake_hash(1)) is a and pool.get_cached_block(fake_hash(2)) is b


def test_reallocating_a_cached_block_evicts_its_hash_lru_first():
    pool = BlockPool(4)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_full_blocks([a, b, c], [fake_hash(1), fake_hash(2), fake_hash(3)])
    pool.free_blocks([c])
    pool.free_blocks([a])
    pool.free_blocks([b])  # LRU order now c, a, b
    (got,) = pool.get_new_blocks(1)
    assert got is c and got.block_hash is None
    assert pool.get_cached_block(fake_hash(3)) is None
    assert pool.get_cached_block(fake_hash(1)) is a


def test_touch_revives_a_free_cached_block():
    pool = BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [fake_hash(7)])
    pool.free_blocks([a])
    hit = pool.get_cached_block(fake_hash(7))
    pool.touch([hit])
    assert hit is a and a.ref_cnt == 1 and pool.num_free_blocks == 0
    assert a.block_hash == fake_hash(7)


def test_duplicate_content_stays_uncached_and_cached_blocks_are_not_rehashed():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [fake_hash(1)])
    pool.cache_full_blocks([b], [fake_hash(1)])
    assert pool.get_cached_block(fake_hash(1)) is a and b.block_hash is None
    pool.cache_full_blocks([a], [fake_hash(9)])
    assert a.block_hash == fake_hash(1) and pool.get_cached_block(fake_hash(9)) is None


def test_caching_disabled_caches_nothing():
    pool = BlockPool(3, enable_caching=False)
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([a], [fake_hash(1)])
    assert a.block_hash is None and pool.cached_blocks == {}


def test_reset_prefix_cache_forgets_every_hash():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a, b], [fake_hash(1), fake_hash(2)])
    pool.free_blocks([a])
    assert pool.reset_prefix_cache() == 2
    assert pool.cached_blocks == {} and a.block_hash is None and b.block_hash is None
    assert b.ref_cnt == 1 and pool.num_free_blocks == 2


def test_blocks_a_reset_uncaches_are_reused_before_blocks_never_used():
    pool = BlockPool(10)
    used = pool.get_new_blocks(5)
    pool.cache_full_blocks(used[:4], [fake_hash(i) for i in range(4)])
    pool.free_blocks(reversed(used))  # the cached ones queue at the tail, behind the never-used 6..9
    assert ids(pool.free_queue) == [5, 6, 7, 8, 9, 4, 3, 2, 1]
    pool.reset_prefix_cache()
    assert ids(pool.free_queue) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ids(pool.get_new_blocks(4)) == [1, 2, 3, 4]
