"""The same comparisons on a real GPU with serving-sized steps (ci/gpu_check.sh runs these).

Skipped without CUDA (ROCm builds of torch report CUDA too) or when the interpreter is forced.
"""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]

# Long prefill, chunked prefill on a prefix, and decodes with long contexts, in one step.
MIXED_QUERY_LENS = [300, 1, 77, 1, 1, 128, 1]
MIXED_CONTEXT_LENS = [0, 2047, 512, 33, 900, 1000, 4095]


@pytest.fixture(autouse=True)
def _compiled_kernels(interpreted):
    if interpreted:
        pytest.skip("TRITON_INTERPRET is set: the GPU lane checks compiled kernels")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(32, 8), (16, 16), (9, 3)], ids=["gqa", "mha", "smollm"])
def test_mixed_step_large(paged_case, triton_step, close, dtype, num_heads, num_kv_heads):
    case = paged_case(
        MIXED_QUERY_LENS, MIXED_CONTEXT_LENS, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=64, dtype=dtype
    )
    close(triton_step(case), case.expected(), dtype)


@pytest.mark.parametrize("head_size", [64, 80, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_head_and_block_sizes_large(paged_case, triton_step, close, head_size, block_size):
    case = paged_case(
        MIXED_QUERY_LENS,
        MIXED_CONTEXT_LENS,
        num_heads=8,
        num_kv_heads=2,
        head_size=head_size,
        block_size=block_size,
        dtype=torch.bfloat16,
    )
    close(triton_step(case), case.expected(), torch.bfloat16)


def test_sliding_window_and_soft_cap_large(paged_case, triton_step, close):
    case = paged_case(
        MIXED_QUERY_LENS,
        MIXED_CONTEXT_LENS,
        num_heads=16,
        num_kv_heads=8,
        head_size=128,
        dtype=torch.bfloat16,
        sliding_window=256,
        logits_soft_cap=30.0,
    )
    close(triton_step(case), case.expected(), torch.bfloat16)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cache_rounds_like_torch(paged_case, triton_step, close, kv_cache_dtype):
    case = paged_case(
        MIXED_QUERY_LENS,
        MIXED_CONTEXT_LENS,
        num_heads=32,
        num_kv_heads=8,
        head_size=128,
        dtype=torch.bfloat16,
        kv_cache_dtype=kv_cache_dtype,
        fp8_exact=False,
    )
    expected_cache = case.expected_cache()
    out = triton_step(case)
    assert torch.equal(case.kv_cache.view(torch.uint8), expected_cache.view(torch.uint8))
    close(out, case.expected(), torch.bfloat16)


def test_padded_step_large(paged_case, triton_step, close):
    case = paged_case(
        [1] * 64,
        [17 * i for i in range(64)],
        num_heads=32,
        num_kv_heads=8,
        head_size=128,
        dtype=torch.float16,
        padding=64,
    )
    out = triton_step(case)
    close(out[: case.batch.num_tokens], case.expected(), torch.float16)
    assert not out[case.batch.num_tokens :].any()
