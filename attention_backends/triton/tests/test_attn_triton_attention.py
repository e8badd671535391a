"""The unified attention kernel against dense per-request attention, step shape by step shape.

Shapes stay small: under the Triton interpreter every program runs as Python.
"""

import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_prefill_only(paged_case, triton_step, close):
    case = paged_case([5, 17, 3])
    close(triton_step(case), case.expected(), torch.float32)


def test_decode_only(paged_case, triton_step, close):
    case = paged_case([1, 1, 1, 1], context_lens=[0, 9, 16, 40])
    close(triton_step(case), case.expected(), torch.float32)


def test_mixed_prefill_chunk_and_decodes(paged_case, triton_step, close):
    case = paged_case([1, 7, 1, 20], context_lens=[12, 0, 31, 5])
    close(triton_step(case), case.expected(), torch.float32)


def test_prefix_hits_attend_to_cached_context(paged_case, triton_step, close):
    case = paged_case([6, 3], context_lens=[16, 29])
    close(triton_step(case), case.expected(), torch.float32)


def test_keys_beyond_one_kv_tile(paged_case, triton_step, close):
    case = paged_case([3, 1], context_lens=[70, 130], block_size=32)
    close(triton_step(case), case.expected(), torch.float32)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (6, 2), (8, 1)], ids=["mha", "gqa2", "gqa3", "mqa"]
)
def test_grouped_query_heads(paged_case, triton_step, close, num_heads, num_kv_heads):
    case = paged_case([4, 1], context_lens=[3, 18], num_heads=num_heads, num_kv_heads=num_kv_heads)
    close(triton_step(case), case.expected(), torch.float32)


@pytest.mark.parametrize("window", [1, 4, 33])
def test_sliding_window(paged_case, triton_step, close, window):
    case = paged_case([9, 1, 2], context_lens=[0, 80, 66], sliding_window=window)
    close(triton_step(case), case.expected(), torch.float32)


def test_logits_soft_cap(paged_case, triton_step, close):
    case = paged_case([5, 1], context_lens=[4, 11], logits_soft_cap=0.5)
    case.query.mul_(4.0)  # large scores, so the cap changes the result
    close(triton_step(case), case.expected(), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compute_dtypes(paged_case, triton_step, close, dtype):
    case = paged_case([6, 1], context_lens=[5, 20], dtype=dtype)
    out = triton_step(case)
    assert out.dtype == dtype
    close(out, case.expected(), dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_kv_cache(paged_case, triton_step, close, dtype, kv_cache_dtype):
    case = paged_case([4, 1], context_lens=[2, 17], dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    close(triton_step(case), case.expected(), dtype)


@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
def test_block_sizes(paged_case, triton_step, close, block_size):
    case = paged_case([3, 1], context_lens=[block_size + 2, 2 * block_size - 1], block_size=block_size)
    close(triton_step(case), case.expected(), torch.float32)


@pytest.mark.parametrize("head_size", [8, 24, 64, 80, 128, 256])
def test_head_sizes(paged_case, triton_step, close, head_size):
    case = paged_case([3, 1], context_lens=[1, 6], head_size=head_size, num_heads=2, num_kv_heads=1)
    close(triton_step(case), case.expected(), torch.float32)


def test_non_causal(paged_case, triton_step, close):
    case = paged_case([5, 3], context_lens=[0, 4], causal=False)
    close(triton_step(case), case.expected(), torch.float32)


def test_padding_rows_are_zero_and_not_cached(paged_case, triton_step, close):
    case = paged_case([3, 1], context_lens=[0, 5], padding=3)
    expected_cache = case.expected_cache()
    out = triton_step(case)
    close(out[: case.batch.num_tokens], case.expected(), torch.float32)
    assert torch.equal(out[case.batch.num_tokens :].cpu(), torch.zeros(3, case.spec.num_heads, case.spec.head_size))
    assert torch.equal(case.kv_cache.cpu(), expected_cache.cpu())


def test_non_contiguous_query_key_value(paged_case, triton_step, close):
    case = paged_case([4, 1], context_lens=[0, 7], num_heads=2, num_kv_heads=1)
    q_width, kv_width = case.query[0].numel(), case.key[0].numel()
    fused = torch.cat([case.query.flatten(1), case.key.flatten(1), case.value.flatten(1)], dim=1)
    case.query = fused[:, :q_width].view_as(case.query)
    case.key = fused[:, q_width : q_width + kv_width].view_as(case.key)
    case.value = fused[:, q_width + kv_width :].view_as(case.value)
    assert not case.key.is_contiguous()
    close(triton_step(case), case.expected(), torch.float32)


def test_step_writes_the_new_tokens_into_the_cache(paged_case, triton_step):
    case = paged_case([4, 1], context_lens=[3, 20])
    expected_cache = case.expected_cache()
    triton_step(case)
    assert torch.equal(case.kv_cache.cpu(), expected_cache.cpu())


def test_one_plan_serves_several_layers(paged_case, triton_step, close):
    from tokenmill_attn_triton import TritonAttentionBackend

    # Same seed, same page layout; different head layouts need different query tiles.
    first = paged_case([5, 1], context_lens=[0, 9], num_heads=4, num_kv_heads=2)
    second = paged_case([5, 1], context_lens=[0, 9], num_heads=8, num_kv_heads=1, sliding_window=3)
    assert torch.equal(first.batch.block_tables, second.batch.block_tables)
    backend = TritonAttentionBackend()
    metadata = backend.plan(first.batch)
    for case in (first, second):
        out = backend.forward(case.spec, case.query, case.key, case.value, case.kv_cache, metadata)
        close(out, case.expected(), torch.float32)


def test_requests_without_new_tokens_and_empty_steps(paged_case, triton_step, close):
    case = paged_case([3, 0, 1], context_lens=[0, 5, 9])
    close(triton_step(case), case.expected(), torch.float32)
    empty = paged_case([])
    assert triton_step(empty).shape == (0, empty.spec.num_heads, empty.spec.head_size)
