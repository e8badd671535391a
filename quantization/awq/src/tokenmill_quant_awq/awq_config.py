"""AWQ settings, from ``config.json``'s ``quantization_config`` or AutoAWQ's ``quant_config.json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SIDE_FILE = "quant_config.json"  # AutoAWQ writes its settings here when config.json has none


@dataclass(frozen=True)
class AWQConfig:
    """4-bit weights, a scale and zero point per ``group_size`` input rows and output column."""

    group_size: int = 128
    modules_to_not_convert: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> AWQConfig:
        """Validate; ``ValueError`` names the unsupported setting."""
        bits = config.get("bits", config.get("w_bit", 4))
        if bits != 4:
            raise ValueError(f"AWQ bits={bits!r} is not supported (only 4)")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version {version!r} is not supported (only the GEMM layout)")
        if not config.get("zero_point", True):
            raise ValueError("AWQ without zero points is not supported")
        group_size = config.get("group_size", config.get("q_group_size", 128))
        if not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"AWQ group_size={group_size!r} must be a positive integer")
        return cls(group_size=group_size, modules_to_not_convert=tuple(config.get("modules_to_not_convert") or ()))

