"""The CPU platform's ``back_kv_cache`` through core's KvCachePages: blocks backed ahead of their first
writes, contents untouched, in block order."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

from tokenmill.runner.kv_cache_pages import KvCachePages
from tokenmill_cpu.platform import CpuPlatform

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
BLOCKS, BLOCK_SIZE, HEADS, HEAD = 64, 16, 4, 256  # 64 KiB per block and half (keys or values)
PLATFORM = CpuPlatform()


def _faults_writing(tensor: torch.Tensor) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensor.fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _caches(layers: int = 2) -> list[torch.Tensor]:
    return [PLATFORM.allocate_kv_cache((2, BLOCKS, BLOCK_SIZE, HEADS, HEAD), torch.float32) for _ in range(layers)]


@linux
def test_backed_blocks_take_no_page_faults_when_written_and_the_rest_still_do():
    caches = _caches()
    pages = KvCachePages(caches, block_dim=1, num_blocks=BLOCKS, back_blocks=PLATFORM.back_kv_cache)
    backed = pages.back(2 * 2 * 16 * 64 * 1024)  # 16 blocks of both layers' keys and values
    if pages.done:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert backed == 2 * 2 * 16 * 64 * 1024 and pages.backed == 16 and pages.seconds > 0
    assert _faults_writing(caches[0][:, :16]) + _faults_writing(caches[1][:, :16]) < 64  # 1024 pages unbacked
    assert _faults_writing(caches[1][:, 16:32]) >= 400  # 2 x 16 blocks of 16 pages each


@linux
def test_backing_keeps_what_the_blocks_hold_and_goes_on_from_where_it_stopped():
    caches = _caches(1)
    caches[0][1, 3].fill_(7.0)
    pages = KvCachePages(caches, block_dim=1, num_blocks=BLOCKS, back_blocks=PLATFORM.back_kv_cache)
    steps = []
    while not pages.done:
        steps.append(pages.back(40 * 64 * 1024))  # 20 blocks of keys and values
    assert pages.backed == BLOCKS and pages.back(1 << 20) == 0
    assert len(steps) in (1, 4)  # 1: the kernel refused, nothing backed; else 20, 20, 20, 4 blocks
    assert torch.count_nonzero(caches[0]) == BLOCK_SIZE * HEADS * HEAD
    assert torch.all(caches[0][1, 3] == 7.0)


def test_what_cannot_be_backed_ends_the_work_at_once():
    assert KvCachePages([], block_dim=1, num_blocks=8, back_blocks=PLATFORM.back_kv_cache).done
    pages = KvCachePages([torch.zeros(2, 8, 4)[:, ::2]], block_dim=1, num_blocks=4, back_blocks=PLATFORM.back_kv_cache)
    assert not pages.done and pages.back(1 << 20) == 0 and pages.done  # not contiguous: refused

