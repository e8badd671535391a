"""FP8 settings from either config shape tokenmill reads:

* ``{"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}``
  (vLLM / transformers' FP8 configs; with a block size the scales are named ``weight_scale_inv``,
  DeepSeek-style, and still multiply the weights; without, ``weight_scale`` per tensor or channel);
* compressed-tensors ``format: float-quantized`` with one config group of 8-bit float weights
  (``strategy`` "tensor", "channel" or "block" with ``block_structure``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenmill.plugin_api.compressed_tensors import LINEAR_TARGET, config_format, module_matches, single_config_group
from tokenmill.plugin_api.quantization_config import declared_method, full_precision_modules

FLOAT_QUANTIZED = "float-quantized"


@dataclass(frozen=True)
class FP8Scheme:
    """``block`` (rows, columns) for block-wise scales, else None (a scale per tensor or per output
    row, told apart by the checkpoint's scale shapes); ``scale_name`` is the scale tensor's name."""

    block: tuple[int, int] | None = None
    scale_name: str = "weight_scale"
    ignore: tuple[str, ...] = ("lm_head",)
    source: str = "fp8"

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> FP8Scheme:
        """Parse either shape of ``quantization_config``; ``ValueError`` says what is unsupported."""
        if declared_method(config) == "fp8":
            block = config.get("weight_block_size")
            ignore = full_precision_modules(config, ("modules_to_not_convert", "ignored_layers"))
            if block is None:
                return cls(ignore=ignore)
            return cls(block=_block(block), scale_name="weight_scale_inv", ignore=ignore)
        if config_format(config) == FLOAT_QUANTIZED:
            return cls._from_compressed_tensors(config)
        raise ValueError("not an fp8 checkpoint (quant_method fp8 or compressed-tensors float-quantized)")

    @classmethod
    def _from_compressed_tensors(cls, config: Mapping[str, Any]) -> FP8Scheme:
        group, weights = single_config_group(config)
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise ValueError(f"compressed-tensors float-quantized weights must be 8-bit floats, got {dict(weights)}")
        strategy = weights.get("strategy")
        if strategy not in ("tensor", "channel", "block"):
            raise ValueError(f"compressed-tensors fp8 weight strategy {strategy!r} is not supported")
        targets = tuple(group.get("targets") or (LINEAR_TARGET,))
        if any(t != LINEAR_TARGET and not t.startswith("re:") for t in targets):
            raise ValueError(f"compressed-tensors targets {targets} are not supported (Linear or re: patterns)")
        ignore = tuple(config.get("ignore") or ())
        block = _block(weights.get("block_structure")) if strategy == "block" else None
        return cls(block=block, ignore=ignore, source="compressed-tensors")

    def quantizes(self, module: str) -> bool:
        """Whether module path ``module`` is stored in fp8 (not ignored)."""
        return not module_matches(module, self.ignore)

    def describe(self) -> str:
        """``fp8 e4m3 (block 128x128 scales)``-style summary."""
        scales = "per-tensor/channel scales" if self.block is None else f"block {self.block[0]}x{self.block[1]} scales"
        return f"fp8 e4m3 ({scales}; {self.source})"


def _block(value: Any) -> tuple[int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
        raise ValueError(f"fp8 block size {value!r} must be two positive integers")
    return int(value[0]), int(value[1])
