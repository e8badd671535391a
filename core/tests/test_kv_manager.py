"""KVCacheManager: allocation, prefix-cache hits, forking, free order, eviction and stats."""

import pytest

from tokenmill.kv_cache import KVCacheManager
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams

BS = 4


def make_request(request_id: str, prompt, salt=None) -> Request:
    return Request(request_id, list(prompt), SamplingParams(max_tokens=8), cache_salt=salt)


def compute(manager: KVCacheManager, request: Request, num_tokens: int | None = None) -> None:
    """A step of its own: allocate and 'run' a request's uncomputed tokens, then cache its full blocks
    (as the scheduler does)."""
    manager.begin_step()
    if num_tokens is None:
        num_tokens = request.num_tokens - request.num_computed_tokens
    assert manager.allocate_slots(request, num_tokens)
    request.num_computed_tokens += num_tokens
    manager.cache_blocks(request)


def admit(manager: KVCacheManager, request: Request, same_step: bool = False) -> int:
    """Plan all of a request's uncomputed tokens, in a new step or in the step being planned."""
    if not same_step:
        manager.begin_step()
    blocks, num_computed = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - num_computed, blocks)
    request.num_computed_tokens = num_computed
    return num_computed


def test_allocate_grows_the_table_block_by_block():
    manager = KVCacheManager(num_blocks=10, block_size=BS)
    request = make_request("a", range(6))
    assert manager.allocate_slots(request, 6)
    assert len(manager.get_block_ids("a")) == 2
    request.num_computed_tokens = 6
    assert manager.allocate_slots(request, 2)  # fills block 2 exactly
    assert len(manager.get_block_ids("a")) == 2
    request.num_computed_tokens = 8
    assert manager.allocate_slots(request, 1)
    assert len(manager.get_block_ids("a")) == 3
    assert 0 not in manager.get_block_ids("a")  # the null block is never handed out


def test_allocate_failure_allocates_nothing():
    manager = KVCacheManager(num_blocks=4, block_size=BS)  # 3 usable blocks
    a = make_request("a", range(8))
    assert manager.allocate_slots(a, 8)
    b = make_request("b", range(100, 108))
    assert not manager.allocate_slots(b, 8)
    assert manager.get_block_ids("b") == [] and manager.num_free_blocks == 1
    assert manager.allocate_slots(b, 4)


def test_prefix_hit_shares_full_blocks_and_leaves_the_last_token():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    a = make_request("a", range(10))
    compute(manager, a)
    b = make_request("b", [*range(10), 50, 51])
    blocks, num_computed = manager.get_computed_blocks(b)
    assert num_computed == 8
    assert [blk.block_id for blk in blocks] == manager.get_block_ids("a")[:2]
    assert admit(manager, b) == 8
    assert manager.get_block_ids("b")[:2] == manager.get_block_ids("a")[:2]
    assert manager.get_block_ids("b")[2] != manager.get_block_ids("a")[2]
    assert all(blk.ref_cnt == 2 for blk in blocks)


def test_a_prompt_of_exactly_cached_blocks_still_recomputes_its_last_block():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    a = make_request("a", range(8))
    compute(manager, a)
    b = make_request("b", range(8))
    blocks, num_computed = manager.get_computed_blocks(b)
    assert num_computed == 4 and len(blocks) == 1


def test_salts_never_share_blocks():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    compute(manager, make_request("a", range(9), salt="tenant-1"))
    assert manager.get_computed_blocks(make_request("b", range(9), salt="tenant-2"))[1] == 0
    assert manager.get_computed_blocks(make_request("c", range(9)))[1] == 0
    assert manager.get_computed_blocks(make_request("d", range(9), salt="tenant-1"))[1] == 8


def test_only_computed_blocks_are_cached():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    a = make_request("a", range(12))
    compute(manager, a, num_tokens=6)  # a chunk: one full computed block
    assert manager.get_computed_blocks(make_request("b", range(12)))[1] == 4
    compute(manager, a)
    assert manager.get_computed_blocks(make_request("c", range(12)))[1] == 8


def test_prefix_caching_off_never_hits():
    manager = KVCacheManager(num_blocks=20, block_size=BS, enable_prefix_caching=False)
    compute(manager, make_request("a", range(9)))
    assert manager.get_computed_blocks(make_request("b", range(9))) == ([], 0)
    assert manager.prefix_cache_stats.queries == 0


def test_free_returns_everything_and_keeps_content_for_revival():
    manager = KVCacheManager(num_blocks=10, block_size=BS)
    a = make_request("a", range(9))
    compute(manager, a)
    manager.free(a)
    assert manager.num_free_blocks == 9 and manager.usage() == 0.0
    manager.free(a)  # freeing twice is harmless
    b = make_request("b", range(9))
    assert admit(manager, b) == 8
    assert manager.num_free_blocks == 9 - 3


def test_free_order_evicts_a_requests_tail_blocks_first():
    manager = KVCacheManager(num_blocks=5, block_size=BS)  # 4 usable
    a = make_request("a", range(13))
    compute(manager, a)  # blocks for tokens 0-3, 4-7, 8-11 cached; 12 in a partial block
    table = list(manager.get_block_ids("a"))
    manager.free(a)
    eviction_order = [blk.block_id for blk in manager.block_pool.free_queue]
    assert eviction_order[0] == table[3]  # the uncached partial block goes first
    assert eviction_order[1:] == [table[2], table[1], table[0]]  # then the tail of the prompt
    b = make_request("b", range(100, 108))
    compute(manager, b)  # takes 2 blocks: the partial one and a's third block
    hits, num = manager.get_computed_blocks(make_request("c", range(13)))
    assert num == 8 and [blk.block_id for blk in hits] == table[:2]


def test_eviction_under_pressure_drops_stale_hashes():
    manager = KVCacheManager(num_blocks=4, block_size=BS)  # 3 usable
    a = make_request("a", range(12))
    compute(manager, a)
    manager.free(a)
    b = make_request("b", range(100, 112))
    compute(manager, b)  # reuses all three blocks
    assert manager.get_computed_blocks(make_request("c", range(13)))[1] == 0
    assert len(manager.block_pool.cached_blocks) == 3


def test_revived_free_blocks_count_against_free_space():
    manager = KVCacheManager(num_blocks=4, block_size=BS)  # 3 usable
    a = make_request("a", range(9))
    compute(manager, a)  # 3 blocks, 2 cached
    manager.free(a)
    b = make_request("b", [*range(8), 7, 7, 7, 7, 7, 7, 7, 7])
    blocks, num = manager.get_computed_blocks(b)
    assert num == 8
    # b needs 4 blocks in all: the 2 revived ones use up free space too, so this cannot fit
    assert not manager.allocate_slots(b, 8, blocks)
    assert all(blk.ref_cnt == 0 for blk in blocks) and manager.num_free_blocks == 3
    assert manager.allocate_slots(b, 4, blocks)


def test_fork_shares_full_blocks_without_prefix_caching():
    manager = KVCacheManager(num_blocks=20, block_size=BS, enable_prefix_caching=False)
    parent = make_request("p", range(10))
    compute(manager, parent)
    child = make_request("c", range(10))
    assert manager.fork(parent, child) == 8
    assert child.num_computed_tokens == 8
    assert manager.get_block_ids("c") == manager.get_block_ids("p")[:2]
    assert [manager.block_pool.blocks[i].ref_cnt for i in manager.get_block_ids("p")] == [2, 2, 1]
    assert manager.allocate_slots(child, 2)
    assert manager.get_block_ids("c")[2] != manager.get_block_ids("p")[2]
    manager.free(parent)
    assert [manager.block_pool.blocks[i].ref_cnt for i in manager.get_block_ids("c")] == [1, 1, 1]


def test_fork_stops_at_the_first_differing_block_and_at_computed_tokens():
    manager = KVCacheManager(num_blocks=20, block_size=BS, enable_prefix_caching=False)
    parent = make_request("p", range(12))
    compute(manager, parent, num_tokens=6)
    assert manager.get_fork_blocks(parent, make_request("c1", range(12)))[1] == 4
    compute(manager, parent)
    assert manager.get_fork_blocks(parent, make_request("c2", range(12)))[1] == 8  # not the last token's block
    assert manager.get_fork_blocks(parent, make_request("c3", [*range(4), 99, *range(5, 12)]))[1] == 4


def test_prefix_cache_stats_count_tokens_per_admission():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    admit(manager, make_request("a", range(10)))  # planned, never computed: caches nothing
    a = make_request("a2", range(10))
    compute(manager, a)
    admit(manager, make_request("b", range(10)))
    stats = manager.prefix_cache_stats
    assert stats.queries == 30 and stats.hits == 8
    assert stats.hit_rate == pytest.approx(8 / 30)
    assert manager.reset_prefix_cache() == 2
    assert stats.queries == 0 and manager.get_computed_blocks(make_request("c", range(10)))[1] == 0


def test_requests_wanting_prompt_logprobs_never_read_the_cache_but_still_fill_it():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    compute(manager, make_request("a", range(9)))
    wants_logprobs = Request("b", list(range(9)), SamplingParams(max_tokens=4, prompt_logprobs=1))
    assert manager.get_computed_blocks(wants_logprobs) == ([], 0)
    manager.free(make_request("a", range(9)))
    compute(manager, wants_logprobs)
    assert manager.get_computed_blocks(make_request("c", range(9)))[1] == 8


def test_a_request_planned_after_another_in_one_step_shares_the_blocks_that_step_completes():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    a, b = make_request("a", range(10)), make_request("b", [*range(10), 42])
    admit(manager, a)
    assert admit(manager, b, same_step=True) == 8  # a's blocks 0-1 are written this step, before b attends
    assert manager.get_block_ids("b")[:2] == manager.get_block_ids("a")[:2]
    assert manager.get_block_ids("b")[2] != manager.get_block_ids("a")[2]  # a's partial block is its own
    assert [block.ref_cnt for block in manager.req_to_blocks["a"][:2]] == [2, 2]
    assert manager.prefix_cache_stats.hits == 8
    assert admit(manager, make_request("c", range(10))) == 0  # a new step: a's blocks were never computed


def test_only_the_blocks_a_chunk_completes_are_shared_in_its_step():
    manager = KVCacheManager(num_blocks=20, block_size=BS)
    a = make_request("a", range(12))
    manager.begin_step()
    assert manager.allocate_slots(a, 6)  # tokens 0-5: block 0 complete, block 1 not
    assert admit(manager, make_request("b", range(12)), same_step=True) == 4
    a.num_computed_tokens = 6
    manager.cache_blocks(a)
    manager.begin_step()
    assert manager.allocate_slots(a, 6)  # tokens 6-11 complete blocks 1 and 2
    assert admit(manager, make_request("c", range(13)), same_step=True) == 12  # block 0 cached, 1-2 in flight


def test_draft_tokens_and_salted_or_freed_blocks_are_not_shared_in_flight():
    manager = KVCacheManager(num_blocks=30, block_size=BS)
    a = make_request("a", range(8))
    compute(manager, a, num_tokens=7)
    a.append_output_token(8)  # its first output token: 9 tokens, 8 computed after the step below
    compute(manager, a, num_tokens=1)
    manager.begin_step()
    assert manager.allocate_slots(a, 4)  # token 8 and three drafts (positions 9-11), not known tokens yet
    assert admit(manager, make_request("b", range(16)), same_step=True) == 8  # block 2 is not offered
    assert admit(manager, make_request("s", range(16), salt="x"), same_step=True) == 0
    manager.begin_step()
    d = make_request("d", range(100, 110))
    assert admit(manager, d, same_step=True) == 0
    manager.free(d)  # preempted while the step is planned: computes nothing in it
    assert admit(manager, make_request("e", range(100, 110)), same_step=True) == 0
