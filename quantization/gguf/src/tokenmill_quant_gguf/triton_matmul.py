"""The packed-GGUF dequantize-inside-matmul Triton kernel for Q8_0, Q4_0 and Q4_1 rows:
``y = x @ W.T`` with ``W`` [N, K] kept as raw ggml blocks (uint8 ``[N, row_bytes]``).

Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``, one launch per run of rows of one type. A program
owns a ``BLOCK_M x BLOCK_N`` tile of ``y`` and walks the input dimension ``BLOCK_K`` elements at a
time. Element ``k`` of row ``n`` lives in block ``k // 32`` at byte ``n * row_stride + (k // 32) *
type_size``; the block's float16 ``d`` (and Q4_1's ``m``) are read through a float16 view of the
same bytes (every block size and field offset is even). Values: Q8_0 ``d * int8``, Q4_0
``d * (nibble - 8)``, Q4_1 ``d * nibble + m``, where value ``j < 16`` of a 4-bit block is the low
nibble of its byte ``j`` and value ``j >= 16`` the high nibble of byte ``j - 16``. The tile is
rounded to the activation dtype (as the torch reference does) and accumulated in fp32.

Importing this module imports triton and decorates the kernel, so ``TRITON_INTERPRET`` must be set
before the first import (tests on the CPU); ``GGUFPackedTritonKernel`` imports it on first use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.triton_kernel import CPU_REASON

# kind, type_size (bytes per 32-element block), offset of the quantized values in a block
_LAYOUTS = {GGMLType.Q8_0: (0, 34, 2), GGMLType.Q4_0: (1, 18, 2), GGMLType.Q4_1: (2, 20, 4)}
SUPPORTED_TYPES = tuple(_LAYOUTS)


@triton.jit
def _gguf_matmul_kernel(
    x_ptr,
    bytes_ptr,
    halves_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_row,
    stride_om,
    KIND: tl.constexpr,
    TYPE_SIZE: tl.constexpr,
    VALUES_AT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    row_base = offs_n.to(tl.int64) * stride_row
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        offs_k = k_start + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        kn_mask = k_mask[:, None] & n_mask[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        block_base = row_base[None, :] + ((offs_k // 32) * TYPE_SIZE)[:, None]  # [BLOCK_K, BLOCK_N] bytes
        j = offs_k % 32
        d = tl.load(halves_ptr + block_base // 2, mask=kn_mask, other=0.0).to(tl.float32)
        if KIND == 0:
            raw = tl.load(bytes_ptr + block_base + VALUES_AT + j[:, None], mask=kn_mask, other=0)
            w = d * raw.to(tl.int8, bitcast=True).to(tl.float32)
        else:
            raw = tl.load(bytes_ptr + block_base + VALUES_AT + (j % 16)[:, None], mask=kn_mask, other=0)
            q = (raw.to(tl.int32) >> ((j // 16) * 4)[:, None]) & 0xF
            if KIND == 1:
                w = d * (q - 8).to(tl.float32)
            else:
                m = tl.load(halves_ptr + block_base // 2 + 1, mask=kn_mask, other=0.0).to(tl.float32)
                w = d * q.to(tl.float32) + m
        w = w.to(x.dtype)
        if DOT_IN_FP32:
            # the interpreter multiplies bfloat16 operands as raw integers; widening first is exact
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, w, input_precision=INPUT_PRECISION)
    out_mask = m_mask[:, None] & n_mask[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


# Whether TRITON_INTERPRET was on when the kernel was decorated (tests on the CPU).
INTERPRETED = type(_gguf_matmul_kernel).__name__ == "InterpretedFunction"


def tile_sizes(rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for ``rows`` activation rows: small M tiles for decode."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    return block_m, 64, 64


def gguf_matmul_into(out: torch.Tensor, x: torch.Tensor, blocks: torch.Tensor, ggml_type: GGMLType) -> None:
    """``out`` [M, N] (a view, e.g. a column slice) = ``x`` [M, K] @ W.T for the rows ``blocks``
    (uint8 ``[N, >= row_bytes]``, contiguous rows) of type ``ggml_type``."""
    if ggml_type not in _LAYOUTS:
        raise ValueError(f"the gguf-packed-triton kernel cannot read {ggml_type.name} blocks")
    if x.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(f"the gguf-packed-triton kernel got CPU tensors: {CPU_REASON}")
    rows, in_features = x.shape
    if rows == 0 or blocks.shape[0] == 0:
        return
    kind, type_size, values_at = _LAYOUTS[ggml_type]
    block_m, block_n, block_k = tile_sizes(rows)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(blocks.shape[0], block_n))
    _gguf_matmul_kernel[grid](
        x, blocks, blocks.view(torch.float16), out,
        rows, blocks.shape[0], in_features,
        x.stride(0), blocks.stride(0), out.stride(0),
        KIND=kind,
        TYPE_SIZE=type_size,
        VALUES_AT=values_at,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        INPUT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        DOT_IN_FP32=INTERPRETED,
    )
