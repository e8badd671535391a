"""Our torch dequantization equals the gguf package's numpy reference bit for bit, for every type."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tokenmill_quant_gguf.dequantize import dequantize
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.gguf_file import GGUFFile

ALL_TYPES = list(GGMLType)


def test_block_geometry_matches_ggml():
    for ggml_type in GGMLType:
        reference = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type.value)]
        assert (ggml_type.block_size, ggml_type.type_size) == reference, ggml_type.name
        assert gguf.GGMLQuantizationType(ggml_type.value).name == ggml_type.name


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_is_bitwise_equal_to_gguf_reference(ggml_type, gguf_fixtures, rng):
    qtype = gguf.GGMLQuantizationType(ggml_type.value)
    values = rng.standard_normal((3, 6, 512)).astype(np.float32) * 3
    encoded = values if ggml_type == GGMLType.F32 else gguf_fixtures.encode(values, qtype, rng)
    if ggml_type == GGMLType.F16:
        encoded = values.astype(np.float16)
    path = gguf_fixtures.write({"t.weight": (encoded, qtype)})

    reader = gguf.GGUFReader(path)
    expected = gguf.quants.dequantize(reader.tensors[0].data, qtype).astype(np.float32)

    file = GGUFFile(path)
    info = file.tensors["t.weight"]
    assert info.ggml_type == ggml_type and info.shape == (3, 6, 512)
    actual = dequantize(file.raw("t.weight"), ggml_type).numpy()
    assert actual.shape == expected.shape == (3, 6, 512)
    assert np.array_equal(actual.view(np.uint32), expected.view(np.uint32))


# Worst-case reconstruction error relative to the largest |value|, for types gguf can quantize.
ROUND_TRIP_TOLERANCE = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 0.01, "Q5_0": 0.07, "Q5_1": 0.07, "Q4_0": 0.15, "Q4_1": 0.15}


@pytest.mark.parametrize("type_name", sorted(ROUND_TRIP_TOLERANCE))
def test_dequantize_of_quantize_is_close_to_the_input(type_name, rng):
    """The layouts are not merely consistently wrong: dequantizing gets back near the original."""
    ggml_type = GGMLType[type_name]
    values = rng.standard_normal((4, 256)).astype(np.float32)
    encoded = gguf.quants.quantize(values, gguf.GGMLQuantizationType(ggml_type.value))
    raw = torch.from_numpy(np.ascontiguousarray(encoded).view(np.uint8).reshape(4, -1))
    restored = dequantize(raw, ggml_type).numpy()
    assert np.abs(restored - values).max() <= ROUND_TRIP_TOLERANCE[type_name] * np.abs(values).max()


def test_dequantize_to_half_precision_rounds_the_float32_result(rng):
    qtype = gguf.GGMLQuantizationType.Q4_1
    encoded = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), qtype)
    raw = torch.from_numpy(encoded.view(np.uint8))
    full = dequantize(raw, GGMLType.Q4_1)
    assert torch.equal(dequantize(raw, GGMLType.Q4_1, torch.bfloat16), full.to(torch.bfloat16))


def test_dequantize_rejects_partial_blocks():
    with pytest.raises(ValueError, match="not a whole number of Q4_K blocks"):
        dequantize(torch.zeros(2, 100, dtype=torch.uint8), GGMLType.Q4_K)
    with pytest.raises(TypeError, match="uint8"):
        dequantize(torch.zeros(2, 144, dtype=torch.int8), GGMLType.Q4_K)
