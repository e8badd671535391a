"""The AWQ dequantize-inside-matmul Triton kernel: ``y = x @ W`` with ``W`` never materialised.

Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``. A program owns a ``BLOCK_M x BLOCK_N`` tile of ``y``
and walks the input dimension ``BLOCK_K`` rows at a time. Row ``k``, column ``n`` of the weight is
nibble ``UNPACK_ORDER[n % 8] = (n % 8) // 2 + 4 * (n % 2)`` of ``qweight[k, n // 8]`` (the GEMM
layout's interleave); its zero point is the same nibble of ``qzeros[k // group_size, n // 8]``.
``(q - zero) * scale`` is rounded to the activation dtype (as the torch reference does) and
multiplied into an fp32 accumulator (the tile scaffolding is ``tokenmill.plugin_api.triton_tiles``). ``AWQTritonKernel`` imports this module (and so triton) on first use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenmill.plugin_api import triton_tiles
from tokenmill.plugin_api.triton import is_interpreted


@triton.jit
def _awq_matmul_kernel(
    x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, M, N, K, group_size, stride_xm, stride_qk, stride_zg,
    stride_sg, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    offs_m, offs_n, m_mask, n_mask, acc = triton_tiles.output_tile(M, N, BLOCK_M, BLOCK_N)
    shift = ((offs_n % 8) // 2 + 4 * (offs_n % 2)) * 4
    for k_start in range(0, K, BLOCK_K):
        offs_k, k_mask, kn_mask, x = triton_tiles.reduction_step(x_ptr, stride_xm, offs_m, m_mask, n_mask, k_start, K,
                                                                 BLOCK_K)
        words = tl.load(qweight_ptr + offs_k[:, None] * stride_qk + (offs_n // 8)[None, :], mask=kn_mask, other=0)
        q = (words >> shift[None, :]) & 0xF
        group = offs_k // group_size
        zero_words = tl.load(qzeros_ptr + group[:, None] * stride_zg + (offs_n // 8)[None, :], mask=kn_mask, other=0)
        zeros = (zero_words >> shift[None, :]) & 0xF
        w = triton_tiles.grouped_affine_weights(q, zeros, scales_ptr, stride_sg, group, offs_n, kn_mask, x)
        acc = triton_tiles.accumulate(acc, x, w, INPUT_PRECISION, DOT_IN_FP32)
    triton_tiles.store_output(out_ptr, stride_om, acc, offs_m, offs_n, m_mask, n_mask)


# Whether TRITON_INTERPRET was on when the kernel was decorated (tests on the CPU).
INTERPRETED = is_interpreted(_awq_matmul_kernel)


def awq_matmul(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int) -> torch.Tensor:
    """``x`` [M, K] times the AWQ weight [K, N] -> [M, N] in ``x``'s dtype."""
    x, out = triton_tiles.launch_buffers(x, scales.shape[1], "awq-triton kernel", INTERPRETED)
    (rows, in_features), out_features = x.shape, out.shape[1]
    if rows == 0:
        return out
    _awq_matmul_kernel[triton_tiles.grid(rows, out_features)](
        x, qweight, qzeros, scales, out,
        rows, out_features, in_features, group_size,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), out.stride(0),
        **triton_tiles.launch_options(x, INTERPRETED),
    )
    return out
