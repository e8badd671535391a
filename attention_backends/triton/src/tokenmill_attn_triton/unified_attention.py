"""The unified paged-attention kernel: prefill chunks and decodes of one step in a single launch.

Grid ``(num_query_tiles, num_kv_heads)``. A program takes ``BLOCK_Q`` query tokens of one request
together with all ``NUM_QUERIES_PER_KV`` query heads that share kv head ``program_id(1)`` (GQA), so
its ``BLOCK_M = BLOCK_Q * NUM_QUERIES_PER_KV`` rows (padded to a power of two) reuse every key and
value tile it loads. It walks the request's keys ``TILE_N`` positions at a time, looking each
position's physical block up in the block table, and keeps a flash-attention online softmax
(running max ``m``, running sum ``l``, unnormalised ``acc``) in fp32.

Query token ``i`` of a request with ``context_len`` cached tokens sits at position
``context_len + i`` and sees key positions ``k <= context_len + i`` (causal) and, with a window
``W``, only ``k > context_len + i - W``. Scores are ``scale * q.k``, soft-capped as
``cap * tanh(s / cap)`` when asked. Keys and values are upcast from the cache dtype (fp8 with
scale 1.0) to the compute dtype before the dot products.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenmill.plugin_api.triton import is_interpreted
from tokenmill_attn_triton.metadata import TritonAttentionMetadata

_LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _dot(a, b, INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    # Triton's interpreter multiplies bfloat16 operands as their raw 16-bit integers; widening them
    # to fp32 first is exact, so the product and fp32 accumulation match a bf16 tensor-core dot.
    if DOT_IN_FP32:
        product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        product = tl.dot(a, b, input_precision=INPUT_PRECISION)
    return product


@triton.jit
def _unified_attention_kernel(
    out_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    tile_request_ptr,
    tile_start_ptr,
    scale,
    softcap,
    stride_query_token,
    stride_query_head,
    stride_out_token,
    stride_out_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_block_table,
    NUM_QUERIES_PER_KV: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_SIZE_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    request = tl.load(tile_request_ptr + tile)
    tile_start = tl.load(tile_start_ptr + tile)
    query_begin = tl.load(query_start_loc_ptr + request)
    query_len = tl.load(query_start_loc_ptr + request + 1) - query_begin
    seq_len = tl.load(seq_lens_ptr + request)
    context_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    query_local = tile_start + rows // NUM_QUERIES_PER_KV
    head = kv_head * NUM_QUERIES_PER_KV + rows % NUM_QUERIES_PER_KV
    row_valid = (rows < BLOCK_Q * NUM_QUERIES_PER_KV) & (query_local < query_len)
    query_pos = context_len + query_local
    dims = tl.arange(0, HEAD_SIZE_PADDED)
    dim_valid = dims < HEAD_SIZE

    token = (query_begin + query_local).to(tl.int64)
    row_offsets = token[:, None] * stride_query_token + head[:, None] * stride_query_head
    q = tl.load(query_ptr + row_offsets + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)

    if IS_CAUSAL:
        last_query = tl.minimum(tile_start + BLOCK_Q, query_len) - 1
        kv_end = context_len + last_query + 1
    else:
        kv_end = seq_len
    kv_begin = 0
    if SLIDING_WINDOW > 0:
        kv_begin = tl.maximum(context_len + tile_start - SLIDING_WINDOW + 1, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_SIZE_PADDED], dtype=tl.float32)
    block_table_row = block_tables_ptr + request.to(tl.int64) * stride_block_table

    for kv_tile in range(kv_begin // TILE_N, tl.cdiv(kv_end, TILE_N)):
        positions = kv_tile * TILE_N + tl.arange(0, TILE_N)
        pos_valid = positions < kv_end
        physical_block = tl.load(block_table_row + positions // BLOCK_SIZE, mask=pos_valid, other=0).to(tl.int64)
        slot = positions % BLOCK_SIZE

        key_offsets = physical_block[None, :] * stride_kc_block + slot[None, :] * stride_kc_slot
        k = tl.load(
            key_cache_ptr + key_offsets + kv_head * stride_kc_head + dims[:, None],
            mask=dim_valid[:, None] & pos_valid[None, :],
            other=0.0,
        )
        value_offsets = physical_block[:, None] * stride_vc_block + slot[:, None] * stride_vc_slot
        v = tl.load(
            value_cache_ptr + value_offsets + kv_head * stride_vc_head + dims[None, :],
            mask=pos_valid[:, None] & dim_valid[None, :],
            other=0.0,
        )

        s = _dot(q, k.to(q.dtype), INPUT_PRECISION, DOT_IN_FP32) * scale
        if USE_SOFTCAP:
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)
        visible = row_valid[:, None] & pos_valid[None, :]
        if IS_CAUSAL:
            visible = visible & (positions[None, :] <= query_pos[:, None])
        if SLIDING_WINDOW > 0:
            visible = visible & (query_pos[:, None] - positions[None, :] < SLIDING_WINDOW)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen no visible key yet keeps m = -inf; shifting by 0 makes its p and alpha 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2((s - m_shift[:, None]) * _LOG2E)
        alpha = tl.exp2((m_i - m_shift) * _LOG2E)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v.to(q.dtype), INPUT_PRECISION, DOT_IN_FP32)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    out_offsets = token[:, None] * stride_out_token + head[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & dim_valid[None, :])


# Whether TRITON_INTERPRET was on when the kernels were decorated (tests on the CPU).
_INTERPRETED = is_interpreted(_unified_attention_kernel)


def _tile_rows(num_queries_per_kv: int, max_query_len: int) -> tuple[int, int]:
    """(BLOCK_Q, BLOCK_M): about 16 rows for decode-only steps, 64 when prefills are present."""
    target_rows = 16 if max_query_len <= 1 else 64
    block_q = max(1, min(target_rows // num_queries_per_kv, triton.next_power_of_2(max_query_len)))
    return block_q, max(16, triton.next_power_of_2(block_q * num_queries_per_kv))


def unified_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: TritonAttentionMetadata,
    *,
    scale: float,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    causal: bool,
) -> None:
    """Attend ``query`` [T, num_heads, head_size] to the cached keys of each token's own request and
    write the result into ``out`` (same shape); rows past ``metadata.num_tokens`` are not touched."""
    _, num_heads, head_size = query.shape
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    num_kv_heads = key_cache.shape[2]
    num_queries_per_kv = num_heads // num_kv_heads
    block_q, block_m = _tile_rows(num_queries_per_kv, metadata.max_query_len)
    tiles = metadata.query_tiles(block_q)
    if tiles.num_tiles == 0:
        return
    head_size_padded = max(16, triton.next_power_of_2(head_size))
    _unified_attention_kernel[(tiles.num_tiles, num_kv_heads)](
        out,
        query,
        key_cache,
        value_cache,
        metadata.block_tables,
        metadata.seq_lens,
        metadata.query_start_loc,
        tiles.request,
        tiles.start,
        scale,
        logits_soft_cap or 1.0,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        metadata.block_tables.stride(0),
        NUM_QUERIES_PER_KV=num_queries_per_kv,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        HEAD_SIZE=head_size,
        HEAD_SIZE_PADDED=head_size_padded,
        BLOCK_SIZE=key_cache.shape[1],
        TILE_N=64 if head_size_padded <= 128 else 32,
        SLIDING_WINDOW=sliding_window or 0,
        USE_SOFTCAP=logits_soft_cap is not None,
        IS_CAUSAL=causal,
        INPUT_PRECISION="ieee" if query.dtype == torch.float32 else None,
        DOT_IN_FP32=_INTERPRETED and query.dtype == torch.bfloat16,
    )
