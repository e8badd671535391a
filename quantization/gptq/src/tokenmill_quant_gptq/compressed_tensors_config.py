"""The part of a compressed-tensors ``quantization_config`` that the ``pack-quantized`` format needs
(parsed by hand: importing the compressed-tensors library costs seconds).

Example (llm-compressor's W4A16 preset)::

    {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
     "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}}}}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PACK_QUANTIZED = "pack-quantized"


def compressed_tensors_format(hf_config: Mapping[str, Any]) -> str | None:
    """The checkpoint's compressed-tensors format ("pack-quantized", ...), or None if it is not one."""
    config = hf_config.get("quantization_config")
    if not isinstance(config, Mapping) or config.get("quant_method") != "compressed-tensors":
        return None
    top_level = config.get("format")
    if top_level and top_level != "mixed-precision":
        return top_level
    groups = config.get("config_groups") or {}
    formats = {g.get("format") for g in groups.values() if isinstance(g, Mapping) and g.get("format")}
    return formats.pop() if len(formats) == 1 else top_level  # one format per group: take it if shared


@dataclass(frozen=True)
class PackQuantizedScheme:
    """Integer weight-only quantization: ``bits`` per weight, a scale per ``group_size`` inputs of
    each output (None: per output channel), zero points unless ``symmetric``, and a stored
    ``weight_g_idx`` when ``actorder`` is "group" (checkpoints of compressed-tensors before 0.20)."""

    bits: int
    group_size: int | None
    symmetric: bool
    group_actorder: bool
    targets: tuple[str, ...] = ("Linear",)
    ignore: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PackQuantizedScheme:
        """Validate; ``ValueError`` says which part of the config is unsupported."""
        groups = [g for g in (config.get("config_groups") or {}).values() if isinstance(g, Mapping)]
        if len(groups) != 1:
            raise ValueError(f"compressed-tensors: {len(groups)} config groups; exactly one is supported")
        group = groups[0]
        weights = group.get("weights") or {}
        if group.get("input_activations"):
            raise ValueError("compressed-tensors pack-quantized with quantized activations is not supported")
        if weights.get("type", "int") != "int":
            raise ValueError(f"compressed-tensors pack-quantized weights of type {weights.get('type')!r} are not supported")
        bits = weights.get("num_bits")
        if bits not in (2, 3, 4, 5, 6, 7, 8):
            raise ValueError(f"compressed-tensors num_bits={bits!r} is not supported (2..8)")
        strategy = weights.get("strategy")
        if strategy not in ("channel", "group"):
            raise ValueError(f"compressed-tensors weight strategy {strategy!r} is not supported (channel, group)")
        group_size = weights.get("group_size") if strategy == "group" else None
        if strategy == "group" and (not isinstance(group_size, int) or group_size <= 0):
            raise ValueError(f"compressed-tensors group_size={group_size!r} must be a positive integer")
        return cls(
            bits=bits,
            group_size=group_size,
            symmetric=bool(weights.get("symmetric", True)),
            group_actorder=weights.get("actorder") in ("group", True),  # legacy: removed in compressed-tensors 0.20
            targets=tuple(group.get("targets") or ("Linear",)),
            ignore=tuple(config.get("ignore") or ()),
        )

    def quantizes(self, module: str) -> bool:
        """Whether the scheme covers module path ``module`` (targets minus ``ignore``)."""
        return _matches(module, self.targets) and not _matches(module, self.ignore)

    def describe(self) -> str:
        group = "per-channel" if self.group_size is None else f"g{self.group_size}"
        return f"compressed-tensors pack-quantized int{self.bits} {group} {'sym' if self.symmetric else 'asym'}"


def _matches(module: str, patterns: tuple[str, ...]) -> bool:
    """compressed-tensors matching: "re:<regex>" against the path, "Linear" for any linear layer,
    otherwise the module path itself (or its last components)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif pattern == "Linear" or module == pattern or module.endswith("." + pattern):
            return True
    return False
