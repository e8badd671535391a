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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenmill.plugin_api.compressed_tensors import config_format, module_matches, single_config_group
from tokenmill.plugin_api.quantization_config import declared_method, full_precision_modules

INT_FORMATS = ("int-quantized", "naive-quantized")
ACTIVATIONS = ("dynamic", "none")


@dataclass(frozen=True)
class Int8Scheme:
    """``w8a8``: activations are quantized too (else weight-only); ``ignore``: full-precision modules."""

    w8a8: bool = True
    ignore: tuple[str, ...] = ("lm_head",)
    source: str = "int8"

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> Int8Scheme:
        """Parse either shape of ``quantization_config``; ``ValueError`` says what is unsupported."""
        if declared_method(config) == "int8":
            activations = config.get("activations", "dynamic")
            if activations not in ACTIVATIONS:
                raise ValueError(f"int8 activations={activations!r} must be one of {ACTIVATIONS}")
            return cls(w8a8=activations == "dynamic", ignore=full_precision_modules(config))
        if config_format(config) in INT_FORMATS:
            return cls._from_compressed_tensors(config)
        raise ValueError("not an int8 checkpoint (quant_method int8 or compressed-tensors int-quantized)")

    @classmethod
    def _from_compressed_tensors(cls, config: Mapping[str, Any]) -> Int8Scheme:
        group, weights = single_config_group(config)
        if weights.get("type", "int") != "int" or weights.get("num_bits") != 8:
            raise ValueError(f"compressed-tensors int-quantized weights must be 8-bit integers, got {dict(weights)}")
        if not weights.get("symmetric", True):
            raise ValueError("compressed-tensors int8 weights with zero points are not supported (symmetric only)")
        if weights.get("strategy") not in ("channel", "tensor"):
            raise ValueError(f"compressed-tensors int8 weight strategy {weights.get('strategy')!r} is not supported")
        activations = group.get("input_activations")
        if activations and (activations.get("type", "int") != "int" or activations.get("num_bits") != 8):
            raise ValueError(f"compressed-tensors activations {dict(activations)} are not int8")
        return cls(w8a8=bool(activations), ignore=tuple(config.get("ignore") or ()), source="compressed-tensors")

    def quantizes(self, module: str) -> bool:
        """Whether module path ``module`` is stored in int8 (not ignored)."""
        return not module_matches(module, self.ignore)

    def describe(self) -> str:
        """``int8 W8A8 (dynamic per-token activations; int8)``-style summary."""
        mode = "W8A8 (dynamic per-token activations" if self.w8a8 else "W8A16 (weight-only"
        return f"int8 {mode}; {self.source})"
