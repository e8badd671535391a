"""The part of a compressed-tensors ``quantization_config`` that the ``pack-quantized`` format needs
(the shape is read by ``tokenmill.plugin_api.compressed_tensors``; llm-compressor's W4A16 and W8A16
presets write it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenmill.plugin_api.compressed_tensors import LINEAR_TARGET, module_matches, single_config_group

PACK_QUANTIZED = "pack-quantized"


@dataclass(frozen=True)
class PackQuantizedScheme:
    """Integer weight-only quantization: ``bits`` per weight, a scale per ``group_size`` inputs of
    each output (None: per output channel), zero points unless ``symmetric``, and a stored
    ``weight_g_idx`` when ``actorder`` is "group" (checkpoints of compressed-tensors before 0.20)."""

    bits: int
    group_size: int | None
    symmetric: bool
    group_actorder: bool
    targets: tuple[str, ...] = (LINEAR_TARGET,)
    ignore: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PackQuantizedScheme:
        """Validate; ``ValueError`` says which part of the config is unsupported."""
        group, weights = single_config_group(config)
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
            targets=tuple(group.get("targets") or (LINEAR_TARGET,)),
            ignore=tuple(config.get("ignore") or ()),
        )

    def quantizes(self, module: str) -> bool:
        """Whether the scheme covers module path ``module`` (targets minus ``ignore``)."""
        return _matches(module, self.targets) and not _matches(module, self.ignore)

    def describe(self) -> str:
        group = "per-channel" if self.group_size is None else f"g{self.group_size}"
        return f"compressed-tensors pack-quantized int{self.bits} {group} {'sym' if self.symmetric else 'asym'}"


def _matches(module: str, patterns: tuple[str, ...]) -> bool:
    """compressed-tensors matching: "Linear" for any linear layer, else ``module_matches``."""
    return LINEAR_TARGET in patterns or module_matches(module, patterns)
