"""GPTQ settings, parsed from ``config.json``'s ``quantization_config`` or an AutoGPTQ
``quantize_config.json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUPPORTED_BITS = (2, 3, 4, 8)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
SIDE_FILE = "quantize_config.json"  # AutoGPTQ writes its settings here when config.json has none


@dataclass(frozen=True)
class GPTQConfig:
    """``bits`` per weight; ``group_size`` input rows share a scale and zero (-1: the whole column);
    ``desc_act``: groups follow activation order (``g_idx``); ``sym``: zero fixed at ``2**(bits-1)``;
    ``zero_offset``: 1 for the GPTQ v1 format, which stores ``zero - 1``, 0 for ``gptq_v2``."""

    bits: int = 4
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True
    zero_offset: int = 1
    lm_head: bool = False
    modules_to_not_convert: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> GPTQConfig:
        """Validate a ``quantization_config``-style mapping; ``ValueError`` names the bad field."""
        bits = config.get("bits", config.get("w_bit", 4))
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"GPTQ bits={bits!r} is not supported (supported: {SUPPORTED_BITS})")
        group_size = config.get("group_size", 128)
        if not isinstance(group_size, int) or (group_size != -1 and group_size <= 0):
            raise ValueError(f"GPTQ group_size={group_size!r} must be a positive integer or -1 (per channel)")
        checkpoint_format = config.get("checkpoint_format", "gptq")
        if checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(f"GPTQ checkpoint_format={checkpoint_format!r} is not supported ({CHECKPOINT_FORMATS})")
        if config.get("dynamic"):
            raise ValueError("GPTQ 'dynamic' per-module overrides are not supported")
        return cls(
            bits=bits,
            group_size=group_size,
            desc_act=bool(config.get("desc_act", False)),
            sym=bool(config.get("sym", True)),
            zero_offset=1 if checkpoint_format == "gptq" else 0,
            lm_head=bool(config.get("lm_head", False)),
            modules_to_not_convert=tuple(config.get("modules_to_not_convert") or ()),
        )

    def num_groups(self, in_features: int) -> int:
        """Scale/zero rows for a layer with ``in_features`` inputs."""
        return 1 if self.group_size == -1 else -(-in_features // self.group_size)

    def describe(self) -> str:
        """``gptq 4-bit g128 sym desc_act``."""
        group = "per-channel" if self.group_size == -1 else f"g{self.group_size}"
        parts = [f"gptq {self.bits}-bit", group, "sym" if self.sym else "asym"]
        if self.desc_act:
            parts.append("desc_act")
        if not self.zero_offset:
            parts.append("v2 zeros")
        return " ".join(parts)

