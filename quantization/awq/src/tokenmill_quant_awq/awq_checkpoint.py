"""``tokenmill quantize --format awq``: a float checkpoint rewritten in AWQ's GEMM layout (4-bit,
a scale and zero point per group of inputs). ``method="awq"`` first runs AWQ's activation-aware
scale search on calibration text (``awq_search``: scales folded into the norms and the linears
before them); ``method="rtn"`` rounds the original weights (AutoAWQ's ``pseudo_quantize_tensor``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokenmill.plugin_api.quantize_tools import (
    DEFAULT_LENGTH,
    DEFAULT_SEQUENCES,
    FloatCheckpoint,
    calibration_text,
    calibration_windows,
    write_checkpoint,
)
from tokenmill_quant_awq.awq_search import awq_search
from tokenmill_quant_awq.packing import PER_WORD
from tokenmill_quant_awq.quantize import quantize_awq

METHODS = ("awq", "rtn")


def quantize_checkpoint(model_dir: str, out_dir: str, *, bits: int = 4, group_size: int = 128, method: str = "awq",
                        calibration_file: str | None = None, calibration_sequences: int = DEFAULT_SEQUENCES,
                        calibration_length: int = DEFAULT_LENGTH) -> dict[str, Any]:
    """Write ``model_dir``'s decoder linears as 4-bit AWQ (GEMM) weights with groups of
    ``group_size`` inputs to ``out_dir``; returns the ``quantization_config`` written."""
    if bits != 4:
        raise ValueError(f"AWQ writes 4-bit weights only, not {bits}")
    if group_size <= 0:
        raise ValueError(f"AWQ group size {group_size} must be positive (AWQ has no per-column mode)")
    if method not in METHODS:
        raise ValueError(f"AWQ method {method!r} is not one of {', '.join(METHODS)}")
    source = FloatCheckpoint(model_dir)
    names = source.linear_weights()
    for name in names:
        out_features, in_features = source.shape(name)
        if in_features % group_size or out_features % PER_WORD:
            fits = _largest_group_size(source, names)
            hint = f"; --group-size {fits} fits every layer" if fits else ""
            raise ValueError(f"{name} {source.shape(name)}: AWQ needs inputs divisible by the group size "
                             f"{group_size} and outputs divisible by {PER_WORD}{hint}")
    weights: dict[str, torch.Tensor] = {}
    if method == "awq":
        windows = calibration_windows(source.tokenizer(), calibration_text(calibration_file), calibration_sequences,
                                      calibration_length)
        weights = awq_search(source, names, windows, group_size)
    config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
              "modules_to_not_convert": None, "quantizer": f"tokenmill ({method})"}
    write_checkpoint(source, Path(out_dir), _tensors(source, set(names), weights, group_size), config)
    return config


def _tensors(source: FloatCheckpoint, names: set[str], weights: dict[str, torch.Tensor],
             group_size: int) -> Iterator[tuple[str, torch.Tensor]]:
    for name in source.names():
        original = source.tensor(name)
        tensor = weights.get(name, original)
        if name in names:
            yield from quantize_awq(tensor, group_size).state_dict(name.removesuffix(".weight")).items()
        else:
            yield name, tensor.to(original.dtype)  # folded norms come back in the checkpoint's dtype


def _largest_group_size(source: FloatCheckpoint, names: list[str]) -> int | None:
    """The largest power of two up to 128 dividing every layer's input size."""
    for size in (128, 64, 32, 16, 8):
        if all(source.shape(name)[1] % size == 0 for name in names):
            return size
    return None
