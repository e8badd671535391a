"""The tile scaffolding of a dequantize-inside-matmul Triton kernel, shared by the quantization
plugins: ``y [M, N] = x [M, K] @ W [K, N]`` where each kernel only says how a ``BLOCK_K x BLOCK_N``
tile of ``W`` is decoded from its packed format.

Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``: a program owns one ``BLOCK_M x BLOCK_N`` tile of
``y`` (``output_tile``, with its zeroed float32 accumulator), walks ``K`` in ``BLOCK_K`` steps
(``reduction_step``: offsets, masks and the activation tile), accumulates (``accumulate``) and stores
once (``store_output``). ``x`` rows are
contiguous (stride 1 along ``K``) and so are ``y``'s. Importing this module imports triton, so
``TRITON_INTERPRET`` must be set before the first import (tests on the CPU).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from tokenmill.plugin_api.triton import refuse_cpu_tensors


@triton.jit
def output_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's row and column offsets into ``y``, their in-bounds masks and a zeroed float32
    accumulator: ``(offs_m, offs_n, m_mask, n_mask, acc)``."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n, offs_m < M, offs_n < N, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def reduction_step(x_ptr, stride_xm, offs_m, m_mask, n_mask, k_start, K, BLOCK_K: tl.constexpr):
    """The ``BLOCK_K`` inputs from ``k_start``: their offsets, their mask, the ``[BLOCK_K, BLOCK_N]``
    mask of the weight tile and the ``[BLOCK_M, BLOCK_K]`` activation tile (zero outside ``x``):
    ``(offs_k, k_mask, kn_mask, x)``."""
    offs_k = k_start + tl.arange(0, BLOCK_K)
    k_mask = offs_k < K
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                other=0.0)
    return offs_k, k_mask, k_mask[:, None] & n_mask[None, :], x


@triton.jit
def grouped_affine_weights(q, zeros, scales_ptr, stride_sg, group, offs_n, kn_mask, x):
    """The weight tile ``(q - zero) * scale`` rounded to ``x``'s dtype (as torch references round),
    with each input row's scales read from row ``group`` of ``scales`` (``[groups, N]``)."""
    scales = tl.load(scales_ptr + group[:, None] * stride_sg + offs_n[None, :], mask=kn_mask, other=0.0)
    scales = scales.to(x.dtype).to(tl.float32)
    return ((q - zeros).to(tl.float32) * scales).to(x.dtype)


@triton.jit
def accumulate(acc, x, w, INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """``acc + x @ w`` in float32; ``w`` is already rounded to ``x``'s dtype."""
    if DOT_IN_FP32:
        # the interpreter multiplies bfloat16 operands as raw integers; widening first is exact
        acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
    else:
        acc += tl.dot(x, w, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def store_output(out_ptr, stride_om, acc, offs_m, offs_n, m_mask, n_mask):
    """Store the accumulated tile into ``y`` in ``y``'s dtype, masked to its bounds."""
    out_mask = m_mask[:, None] & n_mask[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def launch_buffers(x: Any, out_features: int, kernel_name: str, interpreted: bool) -> tuple[Any, Any]:
    """``x`` [M, K] made contiguous and an empty ``[M, out_features]`` output in its dtype on its
    device, for a kernel named ``kernel_name``; a compiled (not ``interpreted``) kernel refuses CPU
    tensors first (``refuse_cpu_tensors``)."""
    refuse_cpu_tensors(x, kernel_name, interpreted)
    x = x.contiguous()
    return x, x.new_empty(x.shape[0], out_features)


def tile_sizes(rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for ``rows`` activation rows: small M tiles for decode."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    return block_m, 64, 64


def grid(rows: int, columns: int) -> tuple[int, int]:
    """The launch grid covering ``rows x columns`` outputs with ``tile_sizes(rows)`` tiles."""
    block_m, block_n, _ = tile_sizes(rows)
    return triton.cdiv(rows, block_m), triton.cdiv(columns, block_n)


def launch_options(x: Any, interpreted: bool) -> dict[str, Any]:
    """The constexpr keyword arguments every tile kernel takes: block sizes for ``x``'s rows, the
    dot precision (exact for float32, tf32 otherwise) and ``DOT_IN_FP32`` under the interpreter."""
    block_m, block_n, block_k = tile_sizes(x.shape[0])
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "INPUT_PRECISION": "ieee" if str(x.dtype) == "torch.float32" else "tf32",
        "DOT_IN_FP32": interpreted,
    }
