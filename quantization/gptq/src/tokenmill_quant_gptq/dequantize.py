"""GPTQ dequantization of a range of output columns (the torch reference math).

``W[i, j] = scales[g_idx[i], j] * (q[i, j] - zero[g_idx[i], j])``, where ``q`` is unpacked from
``qweight`` (int32 ``[in * bits / 32, out]``, packed along the input dimension) and ``zero`` from
``qzeros`` (int32 ``[groups, out * bits / 32]``, packed along the output dimension). The GPTQ v1
format stores ``(zero - 1) mod 2**bits``, so v1 zeros are read back as ``(stored + 1) mod 2**bits``
(AutoGPTQ's own reading).
"""

from __future__ import annotations

import torch

from tokenmill_quant_gptq.bitpack import packed_length, unpack_bits


def unpack_zeros(qzeros: torch.Tensor, bits: int, first: int, end: int, zero_offset: int) -> torch.Tensor:
    """Zero points of output columns ``first:end`` (``first`` a multiple of 32), int32 ``[groups, end - first]``."""
    words = qzeros[:, first * bits // 32 : packed_length(end, bits)]
    zeros = unpack_bits(words, bits, dim=1, count=end - first)
    return (zeros + zero_offset) & ((1 << bits) - 1) if zero_offset else zeros


def dequantize_columns(
    layer: torch.nn.Module, bits: int, zero_offset: int, first: int, end: int, dtype: torch.dtype
) -> torch.Tensor:
    """Weights ``[in_features, end - first]`` of output columns ``first:end`` in ``dtype``."""
    in_features = layer.g_idx.shape[0]
    q = unpack_bits(layer.qweight[:, first:end], bits, dim=0, count=in_features)
    zeros = unpack_zeros(layer.qzeros, bits, first, end, zero_offset)
    groups = layer.g_idx.long()
    scales = layer.scales[:, first:end].to(dtype)
    return (q - zeros[groups]).to(dtype) * scales[groups]
