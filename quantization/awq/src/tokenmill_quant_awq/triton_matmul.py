"""The AWQ dequantize-inside-matmul Triton kernel: ``y = x @ W`` with ``W`` never materialised.

Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``. A program owns a ``BLOCK_M x BLOCK_N`` tile of ``y``
and walks the input dimension ``BLOCK_K`` rows at a time. Row ``k``, column ``n`` of the weight is
nibble ``UNPACK_ORDER[n % 8] = (n % 8) // 2 + 4 * (n % 2)`` of ``qweight[k, n // 8]`` (the GEMM
layout's interleave); its zero point is the same nibble of ``qzeros[k // group_size, n // 8]``.
``(q - zero) * scale`` is rounded to the activation dtype (as the torch reference does) and
multiplied into an fp32 accumulator.

Importing this module imports triton and decorates the kernel, so ``TRITON_INTERPRET`` must be set
before the first import (tests on the CPU); ``AWQTritonKernel`` imports it on first use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenmill_quant_awq.triton_kernel import CPU_REASON


@triton.jit
def _awq_matmul_kernel(
    x_ptr,
    qweight_ptr,
    qzeros_ptr,
    scales_ptr,
    out_ptr,
    M,
    N,
    K,
    group_size,
    stride_xm,
    stride_qk,
    stride_zg,
    stride_sg,
    stride_om,
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
    shift = ((offs_n % 8) // 2 + 4 * (offs_n % 2)) * 4
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        offs_k = k_start + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        kn_mask = k_mask[:, None] & n_mask[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        words = tl.load(qweight_ptr + offs_k[:, None] * stride_qk + (offs_n // 8)[None, :], mask=kn_mask, other=0)
        q = (words >> shift[None, :]) & 0xF
        group = offs_k // group_size
        zero_words = tl.load(qzeros_ptr + group[:, None] * stride_zg + (offs_n // 8)[None, :], mask=kn_mask, other=0)
        zeros = (zero_words >> shift[None, :]) & 0xF
        scales = tl.load(scales_ptr + group[:, None] * stride_sg + offs_n[None, :], mask=kn_mask, other=0.0)
        scales = scales.to(x.dtype).to(tl.float32)
        w = ((q - zeros).to(tl.float32) * scales).to(x.dtype)
        if DOT_IN_FP32:
            # the interpreter multiplies bfloat16 operands as raw integers; widening first is exact
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, w, input_precision=INPUT_PRECISION)
    out_mask = m_mask[:, None] & n_mask[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


# Whether TRITON_INTERPRET was on when the kernel was decorated (tests on the CPU).
INTERPRETED = type(_awq_matmul_kernel).__name__ == "InterpretedFunction"


def tile_sizes(rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for ``rows`` activation rows: small M tiles for decode."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    return block_m, 64, 64


def awq_matmul(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int) -> torch.Tensor:
    """``x`` [M, K] times the AWQ weight [K, N] -> [M, N] in ``x``'s dtype."""
    rows, in_features = x.shape
    out_features = scales.shape[1]
    if x.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(f"the awq-triton kernel got CPU tensors: {CPU_REASON}")
    x = x.contiguous()
    out = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    block_m, block_n, block_k = tile_sizes(rows)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(out_features, block_n))
    _awq_matmul_kernel[grid](
        x, qweight, qzeros, scales, out,
        rows, out_features, in_features, group_size,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        INPUT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        DOT_IN_FP32=INTERPRETED,
    )
    return out
