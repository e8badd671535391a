"""KvCachePages: the platform asked to back blocks in block order, a chunk of bytes at a time, until
done or refused; the block dimension comes from the attention backend's cache shape; the base
platform allocates zeros and backs nothing."""

from __future__ import annotations

import torch

from tokenmill.plugin_api import AttentionBackend
from tokenmill.reference.platform import ReferencePlatform
from tokenmill.runner.kv_cache_pages import KvCachePages
from tokenmill.runner.model_runner import _block_dim

BLOCKS = 10


class BlockLedger:
    """A platform's ``back_kv_cache`` that backs nothing but records what it was asked, refusing after
    ``limit`` calls."""

    def __init__(self, limit: int = 1 << 30) -> None:
        self.calls: list[tuple[int, int, int, int]] = []
        self.limit = limit

    def __call__(self, cache, block_dim, start, stop):
        self.calls.append((cache.shape[block_dim], block_dim, start, stop))
        return len(self.calls) <= self.limit


def _caches(layers: int = 2) -> list[torch.Tensor]:
    return [torch.zeros(2, BLOCKS, 4, 8) for _ in range(layers)]  # 2 x 4 x 8 floats: 256 bytes a block


def test_blocks_are_asked_for_in_order_a_chunk_at_a_time():
    ledger = BlockLedger()
    pages = KvCachePages(_caches(), block_dim=1, num_blocks=BLOCKS, back_blocks=ledger)
    assert pages.back(4 * 2 * 256) == 4 * 2 * 256 and pages.backed == 4
    assert pages.back(1) == 2 * 256 and pages.backed == 5  # at least one block
    assert pages.back(1 << 20) == 5 * 2 * 256 and pages.done and pages.back(1 << 20) == 0
    assert ledger.calls == [(BLOCKS, 1, 0, 4), (BLOCKS, 1, 0, 4), (BLOCKS, 1, 4, 5), (BLOCKS, 1, 4, 5),
                            (BLOCKS, 1, 5, 10), (BLOCKS, 1, 5, 10)]


def test_a_refusal_ends_the_work():
    pages = KvCachePages(_caches(), block_dim=1, num_blocks=BLOCKS, back_blocks=BlockLedger(limit=3))
    assert pages.back(2 * 2 * 256) == 2 * 2 * 256
    assert pages.back(2 * 2 * 256) == 0 and pages.done  # the second layer's blocks were refused


def test_nothing_to_do_without_a_platform_or_caches():
    assert KvCachePages(_caches(), block_dim=1, num_blocks=BLOCKS, back_blocks=None).done
    assert KvCachePages([torch.zeros(0)], block_dim=0, num_blocks=BLOCKS, back_blocks=BlockLedger()).done


def test_the_base_platform_allocates_zeros_and_backs_nothing():
    platform = ReferencePlatform()
    cache = platform.allocate_kv_cache((2, BLOCKS, 4, 8), torch.bfloat16)
    assert cache.shape == (2, BLOCKS, 4, 8) and cache.dtype == torch.bfloat16 and not cache.any()
    pages = KvCachePages([cache], block_dim=1, num_blocks=BLOCKS, back_blocks=platform.back_kv_cache)
    assert pages.back(1 << 20) == 0 and pages.done


def test_the_block_dimension_comes_from_the_backends_shape():
    class Spec:
        num_kv_heads, head_size = 2, 8

    class BlocksFirst(AttentionBackend):
        name = "blocks-first"

        def kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_size):
            return (num_blocks, 2, block_size, num_kv_heads, head_size)

    default = AttentionBackend.__new__(AttentionBackend)
    assert _block_dim(default, 16, [Spec()]) == 1
    assert _block_dim(BlocksFirst.__new__(BlocksFirst), 16, [Spec()]) == 0
    assert _block_dim(default, 16, []) == 0
