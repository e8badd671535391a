"""A validating, memory-mapped reader of GGUF files.

GGUF files come from strangers, so every count, length, dimension and offset in the header is
checked against the file's size before anything is read or allocated; a bad file raises
``ValueError`` naming the file and the offending field or tensor, never an out-of-bounds read.
Tensor data is exposed as zero-copy uint8 views of a copy-on-write memory map.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tokenmill_quant_gguf.ggml_type import GGMLType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_NESTING = 4

# GGUF metadata value types: id -> (struct format, byte size); 8 = string, 9 = array.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9
_NUMPY_ARRAY_TYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8", 11: "<i8", 12: "<f8"}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table, validated against the file."""

    name: str
    ggml_type: GGMLType
    shape: tuple[int, ...]  # PyTorch order: outermost first (GGUF stores ggml's innermost-first order)
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """The shape of the raw bytes: ``shape`` with the last dimension in bytes of whole blocks."""
        return (*self.shape[:-1], self.ggml_type.row_bytes(self.shape[-1]))


class GGUFFile:
    """A parsed GGUF file: ``metadata`` (key -> Python value) and ``tensors`` (name -> info)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.size = os.path.getsize(self.path)
        if self.size < 24:
            raise ValueError(f"{self.path}: not a GGUF file (only {self.size} bytes)")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._pos = 0
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        self._parse()

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a zero-copy uint8 tensor of ``byte_shape``."""
        info = self.tensors[name]
        flat = torch.frombuffer(self._map, dtype=torch.uint8, count=info.nbytes, offset=info.offset)
        return flat.reshape(info.byte_shape)

    def close(self) -> None:
        """Release the memory map (tensors returned by ``raw`` must no longer be used)."""
        self._map.close()

    # -- parsing ---------------------------------------------------------------------------------

    def _parse(self) -> None:
        if self._take(4, "magic") != GGUF_MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file (bad magic)")
        version = self._scalar(4, "version")
        if version & 0xFFFF == 0 and version != 0:
            raise ValueError(f"{self.path}: big-endian GGUF files are not supported")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (supported: 2, 3)")
        n_tensors = self._count(self._scalar(10, "tensor count"), 8 + 4 + 8 + 4 + 8, "tensor count")
        n_kv = self._count(self._scalar(10, "metadata count"), 8 + 4 + 1, "metadata key count")
        for _ in range(n_kv):
            key = self._string("metadata key")
            if key in self.metadata:
                raise ValueError(f"{self.path}: duplicate metadata key {key!r}")
            self.metadata[key] = self._value(self._scalar(4, f"type of {key!r}"), key, depth=0)
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"{self.path}: general.alignment {alignment!r} is not a power of two")
        table = [self._tensor_entry() for _ in range(n_tensors)]
        data_start = -(-self._pos // alignment) * alignment
        for name, ggml_type, shape, relative in table:
            self._add_tensor(name, ggml_type, shape, relative, data_start, alignment)

    def _tensor_entry(self) -> tuple[str, GGMLType, tuple[int, ...], int]:
        name = self._string("tensor name")
        n_dims = self._scalar(4, f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"{self.path}: tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ggml_dims = [self._scalar(10, f"dimensions of {name!r}") for _ in range(n_dims)]
        ggml_type = GGMLType.parse(self._scalar(4, f"type of {name!r}"), name)
        relative = self._scalar(10, f"data offset of {name!r}")
        return name, ggml_type, tuple(reversed(ggml_dims)), relative

    def _add_tensor(
        self, name: str, ggml_type: GGMLType, shape: tuple[int, ...], relative: int, data_start: int, alignment: int
    ) -> None:
        if name in self.tensors:
            raise ValueError(f"{self.path}: duplicate tensor {name!r}")
        if any(d < 1 for d in shape):
            raise ValueError(f"{self.path}: tensor {name!r} has an empty dimension in shape {shape}")
        if shape[-1] % ggml_type.block_size:
            raise ValueError(
                f"{self.path}: tensor {name!r} row length {shape[-1]} is not a multiple of the "
                f"{ggml_type.name} block size {ggml_type.block_size}"
            )
        n_rows = 1
        for d in shape[:-1]:
            n_rows *= d
        nbytes = n_rows * ggml_type.row_bytes(shape[-1])
        offset = data_start + relative
        if relative % alignment:
            raise ValueError(f"{self.path}: tensor {name!r} data offset {relative} is not {alignment}-byte aligned")
        if nbytes > self.size or offset + nbytes > self.size:
            raise ValueError(
                f"{self.path}: tensor {name!r} ({ggml_type.name}, shape {shape}, {nbytes} bytes at offset {offset}) "
                f"extends past the end of the file ({self.size} bytes); the file is truncated or corrupt"
            )
        self.tensors[name] = GGUFTensorInfo(name, ggml_type, shape, offset, nbytes)

    def _value(self, value_type: int, key: str, depth: int) -> Any:
        if value_type in _SCALARS:
            return self._scalar(value_type, f"value of {key!r}")
        if value_type == _STRING:
            return self._string(f"value of {key!r}")
        if value_type != _ARRAY:
            raise ValueError(f"{self.path}: metadata {key!r} has unknown value type {value_type}")
        if depth >= MAX_ARRAY_NESTING:
            raise ValueError(f"{self.path}: metadata {key!r} nests arrays deeper than {MAX_ARRAY_NESTING}")
        item_type = self._scalar(4, f"item type of {key!r}")
        min_item = _SCALARS[item_type][1] if item_type in _SCALARS else 8 + (4 if item_type == _ARRAY else 0)
        count = self._count(self._scalar(10, f"length of {key!r}"), min_item, f"array length of {key!r}")
        if item_type in _NUMPY_ARRAY_TYPES:
            values = np.frombuffer(self._map, dtype=_NUMPY_ARRAY_TYPES[item_type], count=count, offset=self._pos)
            self._pos += count * min_item
            return values.tolist()
        if item_type == 7:
            return [bool(b) for b in self._take(count, f"value of {key!r}")]
        if item_type == _STRING:
            return self._strings(count, key)
        return [self._value(item_type, key, depth + 1) for _ in range(count)]

    def _strings(self, count: int, key: str) -> list[str]:
        """A string array (vocabularies hold ~10^5 of them), read in one tight loop."""
        data, pos, size, out = self._map, self._pos, self.size, []
        unpack = struct.Struct("<Q").unpack_from
        try:
            for _ in range(count):
                if pos + 8 > size:
                    raise ValueError(f"{self.path}: truncated GGUF header inside array {key!r}")
                (length,) = unpack(data, pos)
                if length > size - pos - 8:
                    raise ValueError(f"{self.path}: string length {length} in array {key!r} runs past the file end")
                out.append(data[pos + 8 : pos + 8 + length].decode("utf-8"))
                pos += 8 + length
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: a string in array {key!r} is not UTF-8 ({e.reason})") from None
        self._pos = pos
        return out

    def _scalar(self, value_type: int, what: str) -> Any:
        fmt, size = _SCALARS[value_type]
        return struct.unpack(fmt, self._take(size, what))[0]

    def _string(self, what: str) -> str:
        length = self._scalar(10, f"length of {what}")
        try:
            return self._take(length, what).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: {what} at byte {self._pos - length} is not UTF-8 ({e.reason})") from None

    def _take(self, n: int, what: str) -> bytes:
        if n > self.size - self._pos:
            raise ValueError(
                f"{self.path}: truncated or corrupt GGUF header: {what} needs {n} bytes at offset {self._pos}, "
                f"but the file has {self.size} bytes"
            )
        data = self._map[self._pos : self._pos + n]
        self._pos += n
        return data

    def _count(self, count: int, min_item_bytes: int, what: str) -> int:
        """Reject a count whose items could not possibly fit in the rest of the file."""
        if count * min_item_bytes > self.size - self._pos:
            raise ValueError(f"{self.path}: {what} {count} is impossible for a file of {self.size} bytes")
        return count
