"""The KV-cache write kernel: scatter a step's new keys and values into the paged cache.

One program per token copies that token's ``[num_kv_heads, head_size]`` key and value rows into
slot ``slot_mapping[t]`` (``block_id * block_size + offset``) of the cache, converting to the
cache dtype. An fp8 cache has scale 1.0: values are clamped to the format's finite range, then
rounded to nearest even, like the reference backend. Tokens whose slot is negative are padding and
are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    KV_HEADS_PADDED: tl.constexpr,
    HEAD_SIZE_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SATURATE_AT: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    heads = tl.arange(0, KV_HEADS_PADDED)
    dims = tl.arange(0, HEAD_SIZE_PADDED)
    heads_to_write = tl.where(slot >= 0, NUM_KV_HEADS, 0)  # padding tokens (slot < 0) write nothing
    mask = (heads < heads_to_write)[:, None] & (dims < HEAD_SIZE)[None, :]

    key = tl.load(key_ptr + token * stride_key_token + heads[:, None] * stride_key_head + dims[None, :], mask=mask)
    value = tl.load(
        value_ptr + token * stride_value_token + heads[:, None] * stride_value_head + dims[None, :], mask=mask
    )
    key = key.to(tl.float32)
    value = value.to(tl.float32)
    if SATURATE_AT > 0:
        key = tl.minimum(tl.maximum(key, -SATURATE_AT), SATURATE_AT)
        value = tl.minimum(tl.maximum(value, -SATURATE_AT), SATURATE_AT)
    key_dst = key_cache_ptr + block * stride_kc_block + offset * stride_kc_slot
    value_dst = value_cache_ptr + block * stride_vc_block + offset * stride_vc_slot
    tl.store(
        key_dst + heads[:, None] * stride_kc_head + dims[None, :], key.to(key_cache_ptr.dtype.element_ty), mask=mask
    )
    tl.store(
        value_dst + heads[:, None] * stride_vc_head + dims[None, :],
        value.to(value_cache_ptr.dtype.element_ty),
        mask=mask,
    )


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` [T, num_kv_heads, head_size] into ``kv_cache``
    (2, num_blocks, block_size, num_kv_heads, head_size) at ``slot_mapping`` [T]; slots < 0 are skipped."""
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    if slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {num_tokens} tokens")
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        KV_HEADS_PADDED=triton.next_power_of_2(num_kv_heads),
        HEAD_SIZE_PADDED=triton.next_power_of_2(head_size),
        BLOCK_SIZE=key_cache.shape[1],
        SATURATE_AT=torch.finfo(kv_cache.dtype).max if kv_cache.element_size() == 1 else 0.0,
    )
