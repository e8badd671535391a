"""The KV-cache write kernel against torch's index_copy_."""

import pytest
import torch

from tokenmill_attn_triton.kv_cache_write import write_kv_cache


def _cache_bytes(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(torch.uint8).cpu() if cache.element_size() == 1 else cache.cpu()


@pytest.mark.parametrize(
    ("dtype", "kv_cache_dtype"),
    [
        (torch.float32, "auto"),
        (torch.float16, "auto"),
        (torch.bfloat16, "auto"),
        (torch.float16, "fp8"),
        (torch.bfloat16, "fp8_e4m3"),
        (torch.float32, "fp8_e5m2"),
    ],
    ids=str,
)
def test_write_matches_index_copy(paged_case, dtype, kv_cache_dtype):
    case = paged_case([5, 1, 3], context_lens=[0, 20, 2], dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    expected = case.expected_cache()
    write_kv_cache(case.key, case.value, case.kv_cache, case.batch.slot_mapping)
    assert torch.equal(_cache_bytes(case.kv_cache), _cache_bytes(expected))


@pytest.mark.parametrize(("num_kv_heads", "head_size"), [(1, 8), (3, 24), (2, 80)])
def test_padded_head_shapes(paged_case, num_kv_heads, head_size):
    case = paged_case(
        [4, 1], context_lens=[0, 3], num_heads=num_kv_heads, num_kv_heads=num_kv_heads, head_size=head_size
    )
    expected = case.expected_cache()
    write_kv_cache(case.key, case.value, case.kv_cache, case.batch.slot_mapping)
    assert torch.equal(case.kv_cache.cpu(), expected.cpu())


def test_negative_slots_are_skipped(paged_case):
    case = paged_case([3], padding=4)
    expected = case.expected_cache()
    write_kv_cache(case.key, case.value, case.kv_cache, case.batch.slot_mapping)
    assert torch.equal(case.kv_cache.cpu(), expected.cpu())
    assert int((case.kv_cache != 0).sum()) == 2 * 3 * case.spec.num_kv_heads * case.spec.head_size


def test_strided_key_and_value_views(paged_case):
    case = paged_case([6], num_heads=2, num_kv_heads=2)
    expected = case.expected_cache()
    fused = torch.cat([case.key.flatten(1), case.value.flatten(1)], dim=1)
    key, value = fused.chunk(2, dim=1)
    key, value = key.view_as(case.key), value.view_as(case.value)
    assert not key.is_contiguous()
    write_kv_cache(key, value, case.kv_cache, case.batch.slot_mapping)
    assert torch.equal(case.kv_cache.cpu(), expected.cpu())


def test_empty_step_writes_nothing(paged_case):
    case = paged_case([2])
    before = case.kv_cache.clone()
    write_kv_cache(case.key[:0], case.value[:0], case.kv_cache, case.batch.slot_mapping[:0])
    assert torch.equal(case.kv_cache, before)


def test_slot_mapping_length_must_match(paged_case):
    case = paged_case([3])
    with pytest.raises(ValueError, match="slot_mapping has 2 entries for 3 tokens"):
        write_kv_cache(case.key, case.value, case.kv_cache, case.batch.slot_mapping[:2])


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_saturates_out_of_range_values(paged_case, kv_cache_dtype):
    case = paged_case([2], kv_cache_dtype=kv_cache_dtype, num_heads=1, num_kv_heads=1, head_size=8)
    largest = torch.finfo(case.kv_cache.dtype).max
    case.key[0, 0, :2] = torch.tensor([4 * largest, -4 * largest])
    case.value[1, 0, :2] = torch.tensor([float("inf"), float("-inf")])
    write_kv_cache(case.key, case.value, case.kv_cache, case.batch.slot_mapping)
    slots = case.batch.slot_mapping.cpu()
    flat = case.kv_cache.view(2, -1, 1, 8).float().cpu()
    assert flat[0, slots[0], 0, :2].tolist() == [largest, -largest]
    assert flat[1, slots[1], 0, :2].tolist() == [largest, -largest]
    assert torch.equal(_cache_bytes(case.kv_cache), _cache_bytes(case.expected_cache()))
