"""The ggml tensor types tokenmill reads from GGUF files, with their block geometry."""

from __future__ import annotations

import enum


class GGMLType(enum.IntEnum):
    """ggml type ids as stored in a GGUF tensor table (the subset tokenmill dequantizes)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30

    @property
    def block_size(self) -> int:
        """Elements per block (1 for the plain float types)."""
        return _LAYOUT[self][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return _LAYOUT[self][1]

    @property
    def is_float(self) -> bool:
        """Whether the type is an unquantized float (F32, F16, BF16)."""
        return self.block_size == 1

    def row_bytes(self, n_elements: int) -> int:
        """Bytes that ``n_elements`` values (a multiple of ``block_size``) take."""
        return n_elements // self.block_size * self.type_size

    @classmethod
    def parse(cls, value: int, tensor_name: str) -> GGMLType:
        """The type for a raw id, or ValueError naming the tensor when tokenmill cannot read it."""
        try:
            return cls(value)
        except ValueError:
            supported = ", ".join(t.name for t in cls)
            raise ValueError(
                f"GGUF tensor {tensor_name!r} has ggml type {value} ({_foreign_type_name(value)}), "
                f"which tokenmill cannot dequantize; supported types: {supported}"
            ) from None


QK_K = 256  # elements per K-quant super-block

_LAYOUT: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 2 + 16),  # f16 d, 32 x 4-bit
    GGMLType.Q4_1: (32, 2 + 2 + 16),  # f16 d, f16 m, 32 x 4-bit
    GGMLType.Q5_0: (32, 2 + 4 + 16),  # f16 d, 32 high bits, 32 x 4-bit
    GGMLType.Q5_1: (32, 2 + 2 + 4 + 16),  # f16 d, f16 m, 32 high bits, 32 x 4-bit
    GGMLType.Q8_0: (32, 2 + 32),  # f16 d, 32 x int8
    GGMLType.Q2_K: (QK_K, 16 + 64 + 2 + 2),  # 4-bit scale|min pairs, 2-bit quants, f16 d, f16 dmin
    GGMLType.Q3_K: (QK_K, 32 + 64 + 12 + 2),  # high-bit mask, 2-bit quants, 6-bit scales, f16 d
    GGMLType.Q4_K: (QK_K, 2 + 2 + 12 + 128),  # f16 d, f16 dmin, 6-bit scales/mins, 4-bit quants
    GGMLType.Q5_K: (QK_K, 2 + 2 + 12 + 32 + 128),  # as Q4_K plus 256 high bits
    GGMLType.Q6_K: (QK_K, 128 + 64 + 16 + 2),  # low 4 bits, high 2 bits, int8 scales, f16 d
}


def _foreign_type_name(value: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(value).name
    except (ImportError, ValueError):
        return "unknown type"
