"""Dense bit packing of small unsigned integers into int32 words, shared by GPTQ and
compressed-tensors' ``pack-quantized`` format.

Along the packed dimension the words form one little-endian bit stream: value ``k`` occupies bits
``k * bits .. k * bits + bits - 1``, where bit ``b`` of the stream is bit ``b % 32`` of word
``b // 32``. For 2, 4 and 8 bits this is "``32 // bits`` values per word, lowest bits first"; for
3 bits, 32 values fill exactly 3 words and values 10 and 21 straddle word boundaries (AutoGPTQ's
3-bit layout and compressed-tensors' ``pack_to_int32`` both produce exactly this stream).
"""

from __future__ import annotations

import math

import torch

_WORD_MASK = 0xFFFFFFFF


def packed_length(count: int, bits: int) -> int:
    """Words needed for ``count`` values of ``bits`` bits."""
    return math.ceil(count * bits / 32)


def unpack_bits(words: torch.Tensor, bits: int, dim: int, count: int) -> torch.Tensor:
    """The first ``count`` ``bits``-bit values of the bit stream along ``dim`` of int32 ``words``,
    as int32 (unsigned values), with ``dim`` resized to ``count``."""
    if words.dtype != torch.int32:
        raise TypeError(f"packed words must be int32, got {words.dtype}")
    if not 1 <= bits <= 8:
        raise ValueError(f"bit width {bits} is not in 1..8")
    if words.shape[dim] < packed_length(count, bits):
        raise ValueError(f"{words.shape[dim]} words cannot hold {count} values of {bits} bits")
    stream = words.movedim(dim, -1)
    mask = (1 << bits) - 1
    if 32 % bits == 0:
        per_word = 32 // bits
        shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
        values = (stream.unsqueeze(-1) >> shifts) & mask  # arithmetic shift; the mask drops sign bits
        values = values.reshape(*stream.shape[:-1], stream.shape[-1] * per_word)[..., :count]
    else:
        wide = stream.to(torch.int64) & _WORD_MASK
        starts = torch.arange(count, device=words.device, dtype=torch.int64) * bits
        index, offset = starts // 32, starts % 32
        low = wide[..., index] >> offset
        straddles = offset + bits > 32
        nxt = torch.clamp(index + 1, max=stream.shape[-1] - 1)
        high = torch.where(straddles, wide[..., nxt] << (32 - offset), torch.zeros_like(low))
        values = ((low | high) & mask).to(torch.int32)
    return values.movedim(-1, dim).contiguous()


def pack_bits(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned ``values`` (each < 2**bits) along ``dim`` into int32 words (the inverse of
    ``unpack_bits``); the last word is zero-filled."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bit width {bits} is not in 1..8")
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= 1 << bits):
        raise ValueError(f"values must lie in [0, {(1 << bits) - 1}] to pack into {bits} bits")
    stream = values.movedim(dim, -1).to(torch.int64)
    count = stream.shape[-1]
    n_words = packed_length(count, bits)
    starts = torch.arange(count, device=values.device, dtype=torch.int64) * bits
    index, offset = starts // 32, starts % 32
    words = torch.zeros(*stream.shape[:-1], n_words + 1, dtype=torch.int64, device=values.device)
    words.index_add_(-1, index, (stream << offset) & _WORD_MASK)
    words.index_add_(-1, index + 1, stream >> (32 - offset))  # the part that spills into the next word
    words = words[..., :n_words]
    signed = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return signed.movedim(-1, dim).contiguous()
