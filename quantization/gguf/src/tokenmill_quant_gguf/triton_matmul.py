"""The packed-GGUF dequantize-inside-matmul Triton kernel for Q8_0, Q4_0 and Q4_1 rows:
``y = x @ W.T`` with ``W`` [N, K] kept as raw ggml blocks (uint8 ``[N, row_bytes]``).

Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``, one launch per run of rows of one type. A program
owns a ``BLOCK_M x BLOCK_N`` tile of ``y`` and walks the input dimension ``BLOCK_K`` elements at a
time. Element ``k`` of row ``n`` lives in block ``k // 32`` at byte ``n * row_stride + (k // 32) *
type_size``; the block's float16 ``d`` (and Q4_1's ``m``) are read through a float16 view of the
same bytes (every block size and field offset is even). Values: Q8_0 ``d * int8``, Q4_0
``d * (nibble - 8)``, Q4_1 ``d * nibble + m``, where value ``j < 16`` of a 4-bit block is the low
nibble of its byte ``j`` and value ``j >= 16`` the high nibble of byte ``j - 16``. The tile is
rounded to the activation dtype (as the torch reference does) and accumulated in fp32 (the tile
scaffolding is ``tokenmill.plugin_api.triton_tiles``). ``GGUFPackedTritonKernel`` imports this module (and so triton) on first use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenmill.plugin_api import triton_tiles
from tokenmill.plugin_api.triton import is_interpreted, refuse_cpu_tensors
from tokenmill_quant_gguf.ggml_type import GGMLType

# kind, type_size (bytes per 32-element block), offset of the quantized values in a block
_LAYOUTS = {GGMLType.Q8_0: (0, 34, 2), GGMLType.Q4_0: (1, 18, 2), GGMLType.Q4_1: (2, 20, 4)}
SUPPORTED_TYPES = tuple(_LAYOUTS)


@triton.jit
def _gguf_matmul_kernel(
    x_ptr, bytes_ptr, halves_ptr, out_ptr, M, N, K, stride_xm, stride_row, stride_om,
    KIND: tl.constexpr, TYPE_SIZE: tl.constexpr, VALUES_AT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    offs_m, offs_n, m_mask, n_mask, acc = triton_tiles.output_tile(M, N, BLOCK_M, BLOCK_N)
    row_base = offs_n.to(tl.int64) * stride_row
    for k_start in range(0, K, BLOCK_K):
        offs_k, k_mask, kn_mask, x = triton_tiles.reduction_step(x_ptr, stride_xm, offs_m, m_mask, n_mask, k_start, K,
                                                                 BLOCK_K)
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
        acc = triton_tiles.accumulate(acc, x, w.to(x.dtype), INPUT_PRECISION, DOT_IN_FP32)
    triton_tiles.store_output(out_ptr, stride_om, acc, offs_m, offs_n, m_mask, n_mask)


# Whether TRITON_INTERPRET was on when the kernel was decorated (tests on the CPU).
INTERPRETED = is_interpreted(_gguf_matmul_kernel)


def gguf_matmul_into(out: torch.Tensor, x: torch.Tensor, blocks: torch.Tensor, ggml_type: GGMLType) -> None:
    """``out`` [M, N] (a view, e.g. a column slice) = ``x`` [M, K] @ W.T for the rows ``blocks``
    (uint8 ``[N, >= row_bytes]``, contiguous rows) of type ``ggml_type``."""
    if ggml_type not in _LAYOUTS:
        raise ValueError(f"the gguf-packed-triton kernel cannot read {ggml_type.name} blocks")
    refuse_cpu_tensors(x, "gguf-packed-triton kernel", INTERPRETED)
    rows, in_features = x.shape
    if rows == 0 or blocks.shape[0] == 0:
        return
    kind, type_size, values_at = _LAYOUTS[ggml_type]
    _gguf_matmul_kernel[triton_tiles.grid(rows, blocks.shape[0])](
        x, blocks, blocks.view(torch.float16), out,
        rows, blocks.shape[0], in_features,
        x.stride(0), blocks.stride(0), out.stride(0),
        KIND=kind, TYPE_SIZE=type_size, VALUES_AT=values_at,
        **triton_tiles.launch_options(x, INTERPRETED),
    )
