"""The Triton backend against core's ReferenceAttentionBackend, the correctness oracle of every
backend: same step, same cache, same output (within the compute dtype's tolerance) and same cache
contents afterwards."""

import pytest
import torch

from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend


def _reference_step(case):
    cache = case.kv_cache.clone()
    backend = ReferenceAttentionBackend(device=case.query.device)
    out = backend.forward(case.spec, case.query, case.key, case.value, cache, backend.plan(case.batch))
    return out, cache


def _assert_same_as_reference(case, triton_step, close):
    expected, expected_cache = _reference_step(case)
    out = triton_step(case)
    close(out, expected, case.query.dtype)
    assert torch.equal(case.kv_cache.view(torch.uint8), expected_cache.view(torch.uint8))


STEPS = {
    "prefill": ([5, 17, 3], [0, 0, 0]),
    "decode": ([1, 1, 1], [9, 16, 40]),
    "mixed": ([1, 7, 1, 20], [12, 0, 31, 5]),
    "prefix_hits": ([6, 3], [16, 29]),
}


@pytest.mark.parametrize("step", STEPS)
def test_step_shapes(paged_case, triton_step, close, step):
    _assert_same_as_reference(paged_case(*STEPS[step]), triton_step, close)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (8, 1)], ids=["mha", "gqa3", "mqa"])
def test_grouped_query_heads(paged_case, triton_step, close, num_heads, num_kv_heads):
    case = paged_case(*STEPS["mixed"], num_heads=num_heads, num_kv_heads=num_kv_heads)
    _assert_same_as_reference(case, triton_step, close)


def test_sliding_window(paged_case, triton_step, close):
    _assert_same_as_reference(paged_case([9, 1, 2], [0, 80, 66], sliding_window=5), triton_step, close)


def test_logits_soft_cap(paged_case, triton_step, close):
    case = paged_case(*STEPS["mixed"], logits_soft_cap=0.5)
    case.query.mul_(4.0)
    _assert_same_as_reference(case, triton_step, close)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "fp8_e5m2"])
def test_dtypes_and_fp8_cache(paged_case, triton_step, close, dtype, kv_cache_dtype):
    case = paged_case(*STEPS["mixed"], dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    _assert_same_as_reference(case, triton_step, close)


@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_block_sizes(paged_case, triton_step, close, block_size):
    case = paged_case([3, 1, 1], [block_size + 2, 2 * block_size - 1, 0], block_size=block_size)
    _assert_same_as_reference(case, triton_step, close)
