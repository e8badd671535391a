"""INT8 settings from either config shape tokenmill reads:

* tokenmill's own ``{"quant_method": "int8", "activations": "dynamic", "modules_to_not_convert": [...]}``:
  ``activations`` is "dynamic" (W8A8: activations quantized per token at run time) or "none"
  (W8A16: weight-only); checkpoints hold ``weight`` (int8 ``[out, in]``) and ``weight_scale``
  (float32 ``[out, 1]``, or one scalar per tensor) with ``W = weight * weight_scale``;
* compressed-tensors ``int-quantized`` / ``naive-quantized`` with one config group of symmetric
  8-bit integer weights (strategy "channel" or "tensor"); ``input_activations`` set means W8A8.
  Static activation scales in such checkpoints are loaded but unused (tokenmill's W8A8 kernels
  scale activations per token, at least as accurately).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT_FORMATS = ("int-quantized", "naive-quantized")
ACTIVATIONS = ("dynamic", "none")


def compressed_tensors_format(hf_config: Mapping[str, Any]) -> str | None:
    """The checkpoint's compressed-tensors format, or None if it is not a compressed-tensors one."""
    config = hf_config.get("quantization_config")
    if not isinstance(config, Mapping) or config.get("quant_method") != "compressed-tensors":
        return None
    top_level = config.get("format")
    if top_level and top_level != "mixed-precision":
        return top_level
    groups = config.get("config_groups") or {}
    formats = {g.get("format") for g in groups.values() if isinstance(g, Mapping) and g.get("format")}
    return formats.pop() if len(formats) == 1 else top_level


@dataclass(frozen=True)
class Int8Scheme:
    """``w8a8``: activations are quantized too (else weight-only); ``ignore``: full-precision modules."""

    w8a8: bool = True
    ignore: tuple[str, ...] = ("lm_head",)
    source: str = "int8"

    @classmethod
    def from_hf_config(cls, hf_config: Mapping[str, Any]) -> Int8Scheme:
        """Parse either config shape; ``ValueError`` says what is unsupported."""
        config = hf_config.get("quantization_config")
        if not isinstance(config, Mapping):
            raise ValueError("the checkpoint has no quantization_config")
        if str(config.get("quant_method", "")).lower() == "int8":
            activations = config.get("activations", "dynamic")
            if activations not in ACTIVATIONS:
                raise ValueError(f"int8 activations={activations!r} must be one of {ACTIVATIONS}")
            ignore = tuple(config.get("modules_to_not_convert") or ()) + ("lm_head",)
            return cls(w8a8=activations == "dynamic", ignore=ignore)
        if compressed_tensors_format(hf_config) in INT_FORMATS:
            return cls._from_compressed_tensors(config)
        raise ValueError("not an int8 checkpoint (quant_method int8 or compressed-tensors int-quantized)")

    @classmethod
    def _from_compressed_tensors(cls, config: Mapping[str, Any]) -> Int8Scheme:
        groups = [g for g in (config.get("config_groups") or {}).values() if isinstance(g, Mapping)]
        if len(groups) != 1:
            raise ValueError(f"compressed-tensors: {len(groups)} config groups; exactly one is supported")
        weights = groups[0].get("weights") or {}
        if weights.get("type", "int") != "int" or weights.get("num_bits") != 8:
            raise ValueError(f"compressed-tensors int-quantized weights must be 8-bit integers, got {dict(weights)}")
        if not weights.get("symmetric", True):
            raise ValueError("compressed-tensors int8 weights with zero points are not supported (symmetric only)")
        if weights.get("strategy") not in ("channel", "tensor"):
            raise ValueError(f"compressed-tensors int8 weight strategy {weights.get('strategy')!r} is not supported")
        activations = groups[0].get("input_activations")
        if activations and (activations.get("type", "int") != "int" or activations.get("num_bits") != 8):
            raise ValueError(f"compressed-tensors activations {dict(activations)} are not int8")
        return cls(w8a8=bool(activations), ignore=tuple(config.get("ignore") or ()), source="compressed-tensors")

    def quantizes(self, module: str) -> bool:
        """Whether module path ``module`` is stored in int8 (not ignored)."""
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module):
                    return False
            elif module == pattern or module.endswith("." + pattern):
                return False
        return True

    def describe(self) -> str:
        """``int8 W8A8 (dynamic per-token activations; int8)``-style summary."""
        mode = "W8A8 (dynamic per-token activations" if self.w8a8 else "W8A16 (weight-only"
        return f"int8 {mode}; {self.source})"
