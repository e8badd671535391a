"""The GPTQ dequantize-inside-matmul Triton kernel: ``y = x @ W`` with ``W`` never materialised.

Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``. A program owns a ``BLOCK_M x BLOCK_N`` tile of ``y``
and walks the input dimension ``BLOCK_K`` rows at a time: it loads the packed words of those rows
(``qweight[k // (32 / bits), n]``), shifts out each row's ``bits``-bit value, gathers the row's
group through ``g_idx`` (act order needs no special case: every row looks its group up), loads
that group's scale and packed zero point, and multiplies ``(q - zero) * scale`` (rounded to the
activation dtype, as the torch reference does) into an fp32 accumulator (the tile scaffolding is
``tokenmill.plugin_api.triton_tiles``). ``GPTQTritonKernel`` imports this module (and so triton) on first use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenmill.plugin_api import triton_tiles
from tokenmill.plugin_api.triton import is_interpreted


@triton.jit
def _gptq_matmul_kernel(
    x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, out_ptr, M, N, K, stride_xm, stride_qk, stride_zg,
    stride_sg, stride_om,
    BITS: tl.constexpr, ZERO_OFFSET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    PER_WORD: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    offs_m, offs_n, m_mask, n_mask, acc = triton_tiles.output_tile(M, N, BLOCK_M, BLOCK_N)
    zero_shift = (offs_n % PER_WORD) * BITS
    for k_start in range(0, K, BLOCK_K):
        offs_k, k_mask, kn_mask, x = triton_tiles.reduction_step(x_ptr, stride_xm, offs_m, m_mask, n_mask, k_start, K,
                                                                 BLOCK_K)
        words = tl.load(qweight_ptr + (offs_k // PER_WORD)[:, None] * stride_qk + offs_n[None, :], mask=kn_mask,
                        other=0)
        q = (words >> ((offs_k % PER_WORD) * BITS)[:, None]) & MASK
        group = tl.load(g_idx_ptr + offs_k, mask=k_mask, other=0)
        zero_words = tl.load(qzeros_ptr + group[:, None] * stride_zg + (offs_n // PER_WORD)[None, :], mask=kn_mask,
                             other=0)
        zeros = (((zero_words >> zero_shift[None, :]) & MASK) + ZERO_OFFSET) & MASK
        w = triton_tiles.grouped_affine_weights(q, zeros, scales_ptr, stride_sg, group, offs_n, kn_mask, x)
        acc = triton_tiles.accumulate(acc, x, w, INPUT_PRECISION, DOT_IN_FP32)
    triton_tiles.store_output(out_ptr, stride_om, acc, offs_m, offs_n, m_mask, n_mask)


# Whether TRITON_INTERPRET was on when the kernel was decorated (tests on the CPU).
INTERPRETED = is_interpreted(_gptq_matmul_kernel)


def gptq_matmul(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                g_idx: torch.Tensor, bits: int, zero_offset: int) -> torch.Tensor:
    """``x`` [M, K] times the GPTQ weight [K, N] -> [M, N] in ``x``'s dtype (``bits`` divides 32)."""
    x, out = triton_tiles.launch_buffers(x, scales.shape[1], "gptq-triton kernel", INTERPRETED)
    (rows, in_features), out_features = x.shape, out.shape[1]
    if rows == 0:
        return out
    _gptq_matmul_kernel[triton_tiles.grid(rows, out_features)](
        x, qweight, qzeros, scales, g_idx, out,
        rows, out_features, in_features,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), out.stride(0),
        BITS=bits,
        ZERO_OFFSET=zero_offset,
        **triton_tiles.launch_options(x, INTERPRETED),
    )
    return out
