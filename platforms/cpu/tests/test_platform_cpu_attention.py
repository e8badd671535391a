"""The CPU backend's native kernel, for decodes and prefill chunks, against the plain-PyTorch reference backend."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tokenmill.plugin_api import AttentionBatch, AttentionSpec
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill_cpu.attention import CpuAttentionBackend
from tokenmill_cpu.kernels.native import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def _batch(query_lens, context_lens, block_size, num_blocks, generator):
    """A step over requests with random, disjoint block tables (block 0 stays the null block)."""
    needed = [-(-(q + c) // block_size) for q, c in zip(query_lens, context_lens, strict=True)]
    ids = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    tables = [[ids.pop() for _ in range(count)] for count in needed]
    return AttentionBatch.build(query_lens, context_lens, tables, block_size)


# (17, 1, 80): a prefill tile of 12 tokens x 17 heads, padded to 208 rows of 80 (past the kernel's 64 KiB)
@pytest.mark.parametrize("heads,kv_heads,head_size", [(9, 3, 64), (4, 4, 32), (8, 1, 128), (6, 2, 80), (4, 2, 24),
                                                      (17, 1, 80)])
@pytest.mark.parametrize("window,soft_cap", [(None, None), (7, None), (None, 30.0)])
@pytest.mark.parametrize(("query_lens", "context_lens"), [
    ([1, 1, 1, 1], [0, 37, 15, 50]),
    ([1] * 9, [0, 37, 15, 50, 3, 64, 16, 1, 29]),  # 9: one task per request, all kv heads
    ([1, 5, 1, 3], [0, 37, 15, 50]),
    ([7, 33, 2], [0, 0, 0]),  # fresh prefills of unequal lengths (padded, masked on the reference path)
    ([20, 20], [0, 0]),  # equal lengths: the reference's plain causal SDPA
    ([17, 4], [31, 16]),  # chunks after cached context (a chunked prefill, a prefix-cache hit)
    ([40, 3, 1], [70, 100, 9]),  # query tiles past 16 tokens, key tiles across blocks, and a decode
], ids=["4-decodes", "9-decodes", "mixed", "fresh-prefills", "equal-prefills", "chunks-after-context",
        "long-chunks"])
@pytest.mark.parametrize("fused_qkv", [False, True], ids=["separate", "qkv-views"])
def test_matches_reference(heads, kv_heads, head_size, window, soft_cap, query_lens, context_lens, fused_qkv):
    generator = torch.Generator().manual_seed(heads * 100 + head_size)
    block_size, num_blocks = 16, 64
    spec = AttentionSpec(heads, kv_heads, head_size, head_size**-0.5, "float32", block_size=block_size,
                         sliding_window=window, logits_soft_cap=soft_cap)
    batch = _batch(query_lens, context_lens, block_size, num_blocks, generator)
    shape = (2, num_blocks, block_size, kv_heads, head_size)
    caches = [torch.randn(shape, generator=generator) for _ in range(2)]
    caches[1].copy_(caches[0])
    q = torch.randn(batch.num_tokens, heads, head_size, generator=generator)
    k = torch.randn(batch.num_tokens, kv_heads, head_size, generator=generator)
    v = torch.randn(batch.num_tokens, kv_heads, head_size, generator=generator)
    if fused_qkv:  # strided views of one projection, as the models pass them (keys and values written in C)
        qkv = torch.cat([t.flatten(1) for t in (q, k, v)], dim=1)
        q, k, v = (t.view(t.shape[0], -1, head_size) for t in qkv.split([heads * head_size, kv_heads * head_size,
                                                                          kv_heads * head_size], dim=1))
    reference, native = ReferenceAttentionBackend(), CpuAttentionBackend()
    expected = reference.forward(spec, q, k, v, caches[0], reference.plan(batch))
    actual = native.forward(spec, q, k, v, caches[1], native.plan(batch))
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(caches[1], caches[0], atol=0, rtol=0)


@pytest.mark.parametrize("heads,kv_heads,head_size", [(9, 3, 64), (8, 1, 128), (6, 2, 80)])
@pytest.mark.parametrize("window,soft_cap", [(None, None), (7, None), (None, 30.0)])
@pytest.mark.parametrize(("query_lens", "context_lens"), [
    ([1, 1, 1, 1], [0, 37, 15, 50]),
    ([1] * 9, [0, 37, 15, 50, 3, 64, 16, 1, 29]),
    ([1, 5, 1, 3], [0, 37, 15, 50]),  # decodes among prefills: each group to its kernel
    ([7, 33, 2], [0, 0, 0]),  # a prefill step the prefill kernel takes whole
    ([40, 3], [70, 100]),  # chunks after cached context, query and key tiles across blocks
], ids=["4-decodes", "9-decodes", "mixed", "fresh-prefills", "chunks-after-context"])
def test_bfloat16_matches_the_float32_reference_of_the_same_values(heads, kv_heads, head_size, window, soft_cap,
                                                                    query_lens, context_lens):
    """A bfloat16 cache attends in C, in float32 arithmetic over the bfloat16 values: the result is the
    float32 reference's on the widened inputs, rounded once to bfloat16 (and the cache holds the same keys)."""
    generator = torch.Generator().manual_seed(heads * 10 + head_size)
    block_size, num_blocks = 16, 64
    spec = AttentionSpec(heads, kv_heads, head_size, head_size**-0.5, "bfloat16", block_size=block_size,
                         sliding_window=window, logits_soft_cap=soft_cap)
    batch = _batch(query_lens, context_lens, block_size, num_blocks, generator)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=generator).bfloat16()
    q, k, v = (torch.randn(batch.num_tokens, n, head_size, generator=generator).bfloat16()
               for n in (heads, kv_heads, kv_heads))
    reference, native, calls = ReferenceAttentionBackend(), CpuAttentionBackend(), []
    for kernels in (native._decode_kernels, native._prefill_kernels):
        kernel = kernels[torch.bfloat16]
        kernels[torch.bfloat16] = lambda *args, kernel=kernel: calls.append(kernel(*args))
    expected_cache = cache.float()
    expected = reference.forward(replace(spec, dtype="float32"), q.float(), k.float(), v.float(), expected_cache,
                                 reference.plan(batch))
    actual = native.forward(spec, q, k, v, cache, native.plan(batch))
    assert actual.dtype == torch.bfloat16
    assert len(calls) == (any(n == 1 for n in query_lens) and head_size <= 256) + (max(query_lens) > 1)
    torch.testing.assert_close(actual.float(), expected.bfloat16().float(), atol=1e-2, rtol=8e-3)
    torch.testing.assert_close(cache.float(), expected_cache, atol=0, rtol=0)


def test_a_decode_plan_reads_the_batch_tensors_in_place():
    """Planned once (as a decode graph plans at capture), a decode step stays right when the batch's
    tables, lengths and slots are overwritten with another step's: the plan holds views, not copies."""
    generator = torch.Generator().manual_seed(7)
    block_size, num_blocks, width = 16, 64, 6
    spec = AttentionSpec(9, 3, 64, 0.125, "float32", block_size=block_size)
    first, second = (_batch([1, 1, 1], context, block_size, num_blocks, generator)
                     for context in ([37, 15, 50], [70, 2, 41]))
    static = _batch([1, 1, 1], [37, 15, 50], block_size, num_blocks, generator)
    static.block_tables = torch.zeros(3, width, dtype=torch.int32)
    native = CpuAttentionBackend()
    metadata = native.plan(static)
    assert metadata.decode_tables is static.block_tables and metadata.decode_lens is static.seq_lens
    caches = [torch.randn(2, num_blocks, block_size, 3, 64, generator=generator) for _ in range(2)]
    caches[1].copy_(caches[0])
    for batch in (first, second):
        static.block_tables.zero_()[:, : batch.block_tables.shape[1]].copy_(batch.block_tables)
        static.seq_lens.copy_(batch.seq_lens)
        static.slot_mapping.copy_(batch.slot_mapping)
        q, k, v = (torch.randn(3, heads, 64, generator=generator) for heads in (9, 3, 3))
        expected = ReferenceAttentionBackend().forward(spec, q, k, v, caches[0], ReferenceAttentionBackend().plan(batch))
        actual = native.forward(spec, q, k, v, caches[1], metadata)
        torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(caches[1], caches[0], atol=0, rtol=0)
    assert native.plan(_batch([1, 4], [3, 0], block_size, num_blocks, generator)).decode_tables is None  # a prefill


def test_a_prefill_plan_reads_the_batch_tensors_in_place():
    """Planned once on a split of 12 rows into 10 + 2 (as a prefill graph plans at capture), a prefill
    of one request plus padding stays right for other splits, contexts and tables, down to padding
    of one or no rows: the plan holds views of the starts, lengths, tables and slots."""
    generator = torch.Generator().manual_seed(11)
    block_size, num_blocks, width, rows = 16, 64, 8, 12
    spec = AttentionSpec(9, 3, 64, 0.125, "float32", block_size=block_size)
    static = _batch([10, 2], [0, 0], block_size, num_blocks, generator)
    static.block_tables = torch.zeros(2, width, dtype=torch.int32)
    native = CpuAttentionBackend()
    metadata = native.plan(static)
    assert metadata.prefill is not None and metadata.prefill[1] is static.query_start_loc
    caches = [torch.randn(2, num_blocks, block_size, 3, 64, generator=generator) for _ in range(2)]
    caches[1].copy_(caches[0])
    for tokens, context in ((12, 0), (11, 40), (7, 17), (3, 64)):
        batch = _batch([tokens], [context], block_size, num_blocks, generator)
        static.query_start_loc.copy_(torch.tensor([0, tokens, rows], dtype=torch.int32))
        static.context_lens.copy_(torch.tensor([context, 0], dtype=torch.int32))
        static.seq_lens.copy_(torch.tensor([context + tokens, rows - tokens], dtype=torch.int32))
        static.block_tables.zero_()[0, : batch.block_tables.shape[1]].copy_(batch.block_tables[0])
        static.slot_mapping.fill_(0)[:tokens].copy_(batch.slot_mapping)  # padding writes slot 0 (null block)
        q, k, v = (torch.randn(rows, heads, 64, generator=generator) for heads in (9, 3, 3))
        reference = ReferenceAttentionBackend()
        expected = reference.forward(spec, q[:tokens], k[:tokens], v[:tokens], caches[0], reference.plan(batch))
        actual = native.forward(spec, q, k, v, caches[1], metadata)
        torch.testing.assert_close(actual[:tokens], expected, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(caches[1][:, 1:], caches[0][:, 1:], atol=0, rtol=0)


@pytest.mark.parametrize(("query_lens", "context_lens", "whole"), [
    ([50, 70, 120], [0, 0, 0], True),  # unequal lengths
    ([64, 64], [600, 600], False),  # equal, past PREFILL_MAX_EQUAL_KEYS: PyTorch's flash attention
    ([1, 5, 1, 3], [0, 37, 15, 50], False),  # decodes mixed in: the decode kernel takes those
    ([1, 1], [3, 9], False),  # a decode step
])
def test_the_native_kernel_takes_a_prefill_whole_only_where_it_pays(query_lens, context_lens, whole):
    batch = _batch(query_lens, context_lens, 16, 128, torch.Generator().manual_seed(5))
    assert (CpuAttentionBackend().plan(batch).prefill is not None) is whole


def test_a_slot_outside_the_cache_is_refused():
    generator = torch.Generator().manual_seed(2)
    spec = AttentionSpec(9, 3, 64, 0.125, "float32", block_size=16)
    batch = _batch([5, 3], [0, 0], 16, 8, generator)
    batch.slot_mapping[1] = 8 * 16  # one past the last slot
    q, k, v = (torch.randn(8, heads, 64, generator=generator) for heads in (9, 3, 3))
    native = CpuAttentionBackend()
    with pytest.raises(IndexError, match="1 slot\\(s\\) outside the KV cache of 128 slots"):
        native.forward(spec, q, k, v, torch.zeros(2, 8, 16, 3, 64), native.plan(batch))


@pytest.mark.parametrize(("query_lens", "context_lens", "native"), [
    ([50, 70, 120], [0, 0, 0], True),  # unequal: the reference would pad to 120 and mask
    ([64, 64], [0, 0], True),  # equal, few keys
    ([64, 64], [600, 600], False),  # equal, past PREFILL_MAX_EQUAL_KEYS: PyTorch's flash attention
])
def test_prefill_groups_take_the_native_kernel_where_it_pays(query_lens, context_lens, native):
    generator = torch.Generator().manual_seed(3)
    spec = AttentionSpec(9, 3, 64, 0.125, "float32", block_size=16)
    batch = _batch(query_lens, context_lens, 16, 128, generator)
    backend, calls = CpuAttentionBackend(), []
    kernel = backend._prefill_kernels[torch.float32]
    backend._prefill_kernels[torch.float32] = lambda *args: calls.append(kernel(*args))
    cache = torch.randn(2, 128, 16, 3, 64, generator=generator)
    expected_cache = cache.clone()
    q, k, v = (torch.randn(batch.num_tokens, heads, 64, generator=generator) for heads in (9, 3, 3))
    reference = ReferenceAttentionBackend()
    expected = reference.forward(spec, q, k, v, expected_cache, reference.plan(batch))
    actual = backend.forward(spec, q, k, v, cache, backend.plan(batch))
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
    assert len(calls) == int(native)


def test_selected_on_the_cpu_with_reasons_elsewhere():
    spec = AttentionSpec(9, 3, 64, 0.125, "float32")
    assert CpuAttentionBackend.validate(spec, "cpu") == []
    assert CpuAttentionBackend.validate(spec, "cuda") == ["runs on cpu, not cuda"]
    # the reference it derives from runs on any torch device; its native kernels do not
    assert ReferenceAttentionBackend.validate(spec, "cuda") == []
    assert not CpuAttentionBackend.any_torch_device


def test_loading_the_kernel_keeps_subnormal_floats():
    # a library built with -ffast-math would switch the whole process to flush-to-zero on load
    from tokenmill_cpu.kernels.native import load_library

    load_library()
    assert float(torch.tensor(1e-40, dtype=torch.float32) * 1.0) != 0.0
