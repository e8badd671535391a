"""Dequantization of ggml blocks in PyTorch, vectorised over blocks, on any device.

Every function takes ``blocks`` as uint8 ``[n_blocks, type_size]`` and returns float32
``[n_blocks, block_size]``. The arithmetic mirrors ggml's reference (and the ``gguf`` package's
numpy port) operation by operation in float32, so results are bitwise identical to it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tokenmill_quant_gguf.ggml_type import QK_K, GGMLType


def dequantize(data: torch.Tensor, ggml_type: GGMLType, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize raw GGUF bytes ``[..., row_bytes]`` (uint8) to ``[..., row_elements]`` in ``dtype``."""
    if data.dtype != torch.uint8:
        raise TypeError(f"expected uint8 bytes, got {data.dtype}")
    lead, row_bytes = data.shape[:-1], data.shape[-1]
    if row_bytes % ggml_type.type_size:
        raise ValueError(f"{row_bytes} bytes per row is not a whole number of {ggml_type.name} blocks")
    n_columns = row_bytes // ggml_type.type_size * ggml_type.block_size
    if ggml_type.is_float:
        values = _FLOAT_VIEW[ggml_type](data.contiguous())
    else:
        blocks = data.reshape(-1, ggml_type.type_size).contiguous()
        values = _BLOCK_DEQUANTIZERS[ggml_type](blocks)
    return values.reshape(*lead, n_columns).to(dtype)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The little-endian float16 at byte ``start`` of every block, as float32 ``[n, 1]`` (every ggml
    block size and float16 field offset is even, so contiguous blocks view as float16 directly)."""
    return blocks.view(torch.float16)[:, start // 2 : start // 2 + 1].to(torch.float32)


def _nibbles(packed: torch.Tensor, group: int) -> torch.Tensor:
    """Split bytes into 4-bit values: per ``group`` bytes, first all low nibbles, then all high ones."""
    n = packed.shape[0]
    grouped = packed.reshape(n, -1, 1, group)
    return ((grouped >> _shifts(packed.device, 0, 4)) & 0x0F).reshape(n, -1)


def _bits(packed: torch.Tensor, width: int, group: int) -> torch.Tensor:
    """Split bytes into ``width``-bit fields: per ``group`` bytes, field 0 of each, then field 1, ..."""
    n = packed.shape[0]
    grouped = packed.reshape(n, -1, 1, group)
    shifts = _shifts(packed.device, *range(0, 8, width))
    return ((grouped >> shifts) & ((1 << width) - 1)).reshape(n, -1)


def _shifts(device: torch.device, *amounts: int) -> torch.Tensor:
    return torch.tensor(amounts, dtype=torch.uint8, device=device).reshape(1, 1, -1, 1)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    return blocks[:, 2:].view(torch.int8).to(torch.float32) * d


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, 2:], 16).to(torch.int8) - 8
    return d * q.to(torch.float32)


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _nibbles(blocks[:, 4:], 16).to(torch.float32)
    return d * q + m


def _five_bit(high_mask: torch.Tensor, low_nibbles: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1 values: bit j of the little-endian 32-bit mask is bit 4 of value j."""
    return _nibbles(low_nibbles, 16) | (_mask_bits(high_mask) << 4)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    q = _five_bit(blocks[:, 2:6], blocks[:, 6:]).to(torch.int8) - 16
    return d * q.to(torch.float32)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _five_bit(blocks[:, 4:8], blocks[:, 8:]).to(torch.float32)
    return d * q + m


def _mask_bits(mask: torch.Tensor) -> torch.Tensor:
    """The bits of little-endian bytes in order: bit i of byte b is element 8 * b + i."""
    n = mask.shape[0]
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device).reshape(1, 1, 8)
    return ((mask.reshape(n, -1, 1) >> shifts) & 1).reshape(n, -1)


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    dl = (d * (scales & 0x0F).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    q = _bits(qs, 2, 32).reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    hmask, qs, packed_scales = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    d = _f16(blocks, 108)
    low = _bits(packed_scales[:, :8], 4, 8)
    high = _bits(packed_scales[:, 8:], 2, 4)
    scales = ((low | (high << 4)).to(torch.int8) - 32).to(torch.float32)
    dl = (d * scales).reshape(n, 16, 1)
    ql = _bits(qs, 2, 32).reshape(n, 16, 16)
    qh = _bits(hmask, 1, 32).reshape(n, 16, 16) ^ 1  # the -4 offset applies where the mask bit is 0
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K super-block (12 bytes)."""
    n = packed.shape[0]
    grouped = packed.reshape(n, 3, 4)
    d, m, m_d = grouped[:, 0], grouped[:, 1], grouped[:, 2]
    scales = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scales, mins


def _k_scaled(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    d = (d * scales.to(torch.float32)).reshape(n, 8, 1)
    dm = (dmin * mins.to(torch.float32)).reshape(n, 8, 1)
    return (d * q.reshape(n, 8, 32).to(torch.float32) - dm).reshape(n, QK_K)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    return _k_scaled(blocks, _nibbles(blocks[:, 16:], 32))


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    qh = _bits(blocks[:, 16:48], 1, 32)
    return _k_scaled(blocks, _nibbles(blocks[:, 48:], 32) | (qh << 4))


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    ql, qh, scales = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208]
    d = _f16(blocks, 208)
    d = (d * scales.view(torch.int8).to(torch.float32)).reshape(n, 16, 1)
    q = (_nibbles(ql, 64) | (_bits(qh, 2, 32) << 4)).to(torch.int8) - 32
    return (d * q.reshape(n, 16, 16).to(torch.float32)).reshape(n, QK_K)


_FLOAT_VIEW: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.F32: lambda data: data.view(torch.float32),
    GGMLType.F16: lambda data: data.view(torch.float16).to(torch.float32),
    GGMLType.BF16: lambda data: data.view(torch.bfloat16).to(torch.float32),
}

_BLOCK_DEQUANTIZERS: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
}
