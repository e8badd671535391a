"""Bit packing against compressed-tensors' pack_to_int32 / unpack_from_int32 and AutoGPTQ's packer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

from tokenmill_quant_gptq.bitpack import pack_bits, packed_length, unpack_bits


def autogptq_pack(intweight: np.ndarray, bits: int) -> np.ndarray:
    """AutoGPTQ's ``QuantLinear.pack`` loop (qlinear_cuda_old), packing rows of ``intweight`` [in, out]."""
    intweight = intweight.astype(np.uint32)
    qweight = np.zeros((intweight.shape[0] // 32 * bits, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        if bits in (2, 4, 8):
            for j in range(i, i + 32 // bits):
                qweight[row] |= intweight[j] << (bits * (j - i))
            i += 32 // bits
            row += 1
        else:  # 3 bits: 32 values in 3 words, two of them straddling
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i))
            i += 10
            qweight[row] |= intweight[i] << 30
            row += 1
            qweight[row] |= (intweight[i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 1)
            i += 10
            qweight[row] |= intweight[i] << 31
            row += 1
            qweight[row] |= (intweight[i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 2)
            i += 10
            row += 1
    return qweight.view(np.int32)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_matches_autogptq_packing_along_inputs(bits):
    values = torch.randint(0, 1 << bits, (64, 12), dtype=torch.int32)
    expected = torch.from_numpy(autogptq_pack(values.numpy(), bits))
    assert torch.equal(pack_bits(values, bits, dim=0), expected)
    assert torch.equal(unpack_bits(expected, bits, dim=0, count=64), values)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("count", [32, 96, 40, 7])
@pytest.mark.parametrize("dim", [0, 1])
def test_matches_compressed_tensors(bits, count, dim):
    signed = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (5, count) if dim == 1 else (count, 5), dtype=torch.int8)
    offset = 1 << (bits - 1)  # compressed-tensors stores signed values shifted to unsigned
    expected = pack_to_int32(signed, bits, packed_dim=dim)
    assert torch.equal(pack_bits(signed.to(torch.int32) + offset, bits, dim=dim), expected)
    unpacked = unpack_bits(expected, bits, dim=dim, count=count) - offset
    if dim == 1:
        reference = unpack_from_int32(expected, bits, signed.shape)
    else:  # compressed-tensors 0.20's 4-bit path needs unit last-dim strides (fails on one-word columns)
        rows = expected.T.clone(memory_format=torch.contiguous_format)
        reference = unpack_from_int32(rows, bits, signed.T.shape).T
    assert torch.equal(unpacked.to(torch.int8), reference)


def test_packed_length():
    assert [packed_length(32, b) for b in (2, 3, 4, 8)] == [2, 3, 4, 8]
    assert packed_length(40, 3) == 4


def test_top_bit_set_words_round_trip():
    values = torch.full((8, 3), 15, dtype=torch.int32)
    words = pack_bits(values, 4, dim=0)
    assert int(words[0, 0]) == -1  # 0xFFFFFFFF as int32
    assert torch.equal(unpack_bits(words, 4, dim=0, count=8), values)


def test_errors():
    with pytest.raises(ValueError, match=r"values must lie in \[0, 15\]"):
        pack_bits(torch.tensor([16]), 4, dim=0)
    with pytest.raises(ValueError, match="cannot hold"):
        unpack_bits(torch.zeros(1, dtype=torch.int32), 4, dim=0, count=9)
    with pytest.raises(TypeError, match="int32"):
        unpack_bits(torch.zeros(1, dtype=torch.int64), 4, dim=0, count=8)
    with pytest.raises(ValueError, match="bit width 9"):
        pack_bits(torch.zeros(4, dtype=torch.int32), 9, dim=0)
