"""Corrupt or hostile GGUF files raise a clear ValueError, never crash or read out of bounds."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from tokenmill_quant_gguf.gguf_file import GGUFFile
from tokenmill_quant_gguf.quantizer import GGUFQuantizer

Q8 = gguf.GGMLQuantizationType.Q8_0


@pytest.fixture
def good_file(gguf_fixtures, rng) -> str:
    values = rng.standard_normal((4, 64)).astype(np.float32)
    tensors = {
        "blk.0.attn_q.weight": (gguf.quants.quantize(values, Q8), Q8),
        "output_norm.weight": (rng.standard_normal(64).astype(np.float32), None),
    }
    return gguf_fixtures.write(tensors, metadata={"general.name": "tiny", "tokenizer.ggml.tokens": ["a", "b", "c"]})


def _tensor_entry_offset(data: bytes, name: str) -> int:
    """Offset just after the tensor's name in the tensor table (where n_dims starts)."""
    encoded = name.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded)
    return at + 8 + len(encoded)


def _patched(path: str, offset: int, fmt: str, value) -> str:
    data = bytearray(open(path, "rb").read())
    struct.pack_into(fmt, data, offset, value)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _truncated(path: str, size: int) -> str:
    data = open(path, "rb").read()[:size]
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_good_file_parses(good_file):
    file = GGUFFile(good_file)
    assert file.metadata["general.name"] == "tiny"
    assert file.metadata["tokenizer.ggml.tokens"] == ["a", "b", "c"]
    assert file.tensors["blk.0.attn_q.weight"].shape == (4, 64)
    assert file.raw("blk.0.attn_q.weight").shape == (4, 2 * 34)


def test_wrong_magic(good_file):
    with pytest.raises(ValueError, match="bad magic"):
        GGUFFile(_patched(good_file, 0, "<4s", b"GGML"))


def test_tiny_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(path)


@pytest.mark.parametrize("version, message", [(1, "version 1 is not supported"), (3 << 24, "big-endian")])
def test_unsupported_versions(good_file, version, message):
    with pytest.raises(ValueError, match=message):
        GGUFFile(_patched(good_file, 4, "<I", version))


def test_file_truncated_inside_tensor_data(good_file):
    size = len(open(good_file, "rb").read())
    with pytest.raises(ValueError, match="extends past the end of the file.*truncated or corrupt"):
        GGUFFile(_truncated(good_file, size - 10))


def test_file_truncated_inside_header(good_file):
    inside_tensor_table = _tensor_entry_offset(open(good_file, "rb").read(), "output_norm.weight") + 6
    with pytest.raises(ValueError, match="truncated or corrupt GGUF header: dimensions of 'output_norm.weight'"):
        GGUFFile(_truncated(good_file, inside_tensor_table))


@pytest.mark.parametrize("field, fmt, value", [(8, "<Q", 1 << 40), (16, "<Q", 1 << 62)], ids=["tensor count", "kv count"])
def test_absurd_counts(good_file, field, fmt, value):
    with pytest.raises(ValueError, match="impossible for a file of"):
        GGUFFile(_patched(good_file, field, fmt, value))


def test_absurd_dimension(good_file):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="'blk.0.attn_q.weight'.*extends past the end"):
        GGUFFile(_patched(good_file, at + 4 + 8, "<Q", 1 << 50))


def test_zero_dimension(good_file):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="empty dimension"):
        GGUFFile(_patched(good_file, at + 4 + 8, "<Q", 0))


def test_too_many_dimensions(good_file):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="has 7 dimensions"):
        GGUFFile(_patched(good_file, at, "<I", 7))


def test_row_not_a_whole_number_of_blocks(good_file):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="row length 33 is not a multiple of the Q8_0 block size 32"):
        GGUFFile(_patched(good_file, at + 4, "<Q", 33))


@pytest.mark.parametrize("type_id, name", [(16, "IQ2_XXS"), (977, "unknown type")])
def test_unknown_tensor_type_names_the_tensor(good_file, type_id, name):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match=f"'blk.0.attn_q.weight' has ggml type {type_id} \\({name}\\)"):
        GGUFFile(_patched(good_file, at + 4 + 16, "<I", type_id))


def test_data_offset_out_of_bounds(good_file):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "output_norm.weight")
    with pytest.raises(ValueError, match="'output_norm.weight'.*extends past the end"):
        GGUFFile(_patched(good_file, at + 4 + 8 + 4, "<Q", 1 << 20))


def test_data_offset_wraparound_is_caught(good_file):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "output_norm.weight")
    with pytest.raises(ValueError, match="extends past the end"):
        GGUFFile(_patched(good_file, at + 4 + 8 + 4, "<Q", (1 << 64) - 32))


def test_unaligned_data_offset(good_file):
    at = _tensor_entry_offset(open(good_file, "rb").read(), "output_norm.weight")
    with pytest.raises(ValueError, match="not 32-byte aligned"):
        GGUFFile(_patched(good_file, at + 4 + 8 + 4, "<Q", 4))


def test_duplicate_tensor_names(gguf_fixtures, rng):
    vector = rng.standard_normal(32).astype(np.float32)
    path = gguf_fixtures.write({"a.weight": (vector, None), "b.weight": (vector, None)})
    data = open(path, "rb").read()
    with pytest.raises(ValueError, match="duplicate tensor 'a.weight'"):
        GGUFFile(_patched(path, data.index(b"b.weight"), "<1s", b"a"))


def test_absurd_string_length(good_file):
    data = open(good_file, "rb").read()
    at = data.index(b"general.name") - 8
    with pytest.raises(ValueError, match="truncated or corrupt GGUF header"):
        GGUFFile(_patched(good_file, at, "<Q", 1 << 60))


def test_absurd_array_length(good_file):
    data = open(good_file, "rb").read()
    at = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 4 + 4
    with pytest.raises(ValueError, match="array length of 'tokenizer.ggml.tokens'.*impossible"):
        GGUFFile(_patched(good_file, at, "<Q", 1 << 59))


def test_non_utf8_string(good_file):
    data = open(good_file, "rb").read()
    with pytest.raises(ValueError, match="not UTF-8"):
        GGUFFile(_patched(good_file, data.index(b"tiny"), "<1s", b"\xff"))


def test_bad_alignment(gguf_fixtures, rng):
    vector = rng.standard_normal(32).astype(np.float32)
    path = gguf_fixtures.write({"a.weight": (vector, None)}, metadata={"general.alignment": 48})
    with pytest.raises(ValueError, match="general.alignment 48 is not a power of two"):
        GGUFFile(path)


def test_random_corruption_raises_only_value_errors(good_file):
    """Mutating header bytes at random either still parses or raises ValueError, nothing else."""
    original = open(good_file, "rb").read()
    header_end = GGUFFile(good_file).tensors["blk.0.attn_q.weight"].offset
    rng = np.random.default_rng(7)
    outcomes = set()
    for _ in range(300):
        data = bytearray(original)
        for position in rng.integers(4, header_end, size=int(rng.integers(1, 4))):
            data[position] = int(rng.integers(0, 256))
        with open(good_file, "wb") as f:
            f.write(data)
        try:
            GGUFFile(good_file)
            outcomes.add("parsed")
        except ValueError:
            outcomes.add("rejected")
    assert "rejected" in outcomes


def test_quantizer_reports_corruption_as_value_error(good_file):
    with pytest.raises(ValueError, match="bad magic"):
        GGUFQuantizer.from_config({}, _patched(good_file, 0, "<4s", b"XXXX"))
