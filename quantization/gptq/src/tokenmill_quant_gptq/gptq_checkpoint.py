"""``tokenmill quantize --format gptq``: a float checkpoint rewritten in the GPTQ v1 layout, by
round-to-nearest (``method="rtn"``) or by GPTQ itself (``method="gptq"``: layer by layer on
calibration text, each layer's Hessians taken from the outputs of the already-quantized layers
before it, as AutoGPTQ does without ``true_sequential``)."""

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
    quantize_layer_by_layer,
    write_checkpoint,
)
from tokenmill_quant_gptq.gptq_algorithm import gptq_quantize
from tokenmill_quant_gptq.gptq_config import SUPPORTED_BITS
from tokenmill_quant_gptq.quantize import GPTQTensors, quantize_gptq

METHODS = ("rtn", "gptq")


def quantize_checkpoint(model_dir: str, out_dir: str, *, bits: int = 4, group_size: int = 128, sym: bool = True,
                        desc_act: bool = False, method: str = "gptq", calibration_file: str | None = None,
                        calibration_sequences: int = DEFAULT_SEQUENCES, calibration_length: int = DEFAULT_LENGTH,
                        damp: float = 0.1) -> dict[str, Any]:
    """Write ``model_dir``'s decoder linears as GPTQ ``bits``-bit weights (groups of ``group_size``
    inputs, -1 per column) to ``out_dir``; returns the ``quantization_config`` written. The default
    damping (0.1 of the mean Hessian diagonal, AutoGPTQ uses 0.01) suits small calibration sets."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"GPTQ bits={bits} is not supported (supported: {SUPPORTED_BITS})")
    if group_size != -1 and group_size <= 0:
        raise ValueError(f"GPTQ group size {group_size} must be positive or -1 (one group per column)")
    if method not in METHODS:
        raise ValueError(f"GPTQ method {method!r} is not one of {', '.join(METHODS)}")
    if method == "rtn" and desc_act:
        raise ValueError("act order (--desc-act) orders columns by activation statistics: it needs --method gptq")
    if not 0 < damp < 1:
        raise ValueError(f"GPTQ damping {damp} must lie in (0, 1) (a fraction of the Hessian's mean diagonal)")
    source = FloatCheckpoint(model_dir)
    names = source.linear_weights()
    for name in names:
        out_features, in_features = source.shape(name)
        if in_features * bits % 32 or out_features * bits % 32:
            raise ValueError(f"{name} {source.shape(name)} does not pack into whole {bits}-bit int32 words")
    if method == "gptq":
        text = calibration_text(calibration_file)
        windows = calibration_windows(source.tokenizer(), text, calibration_sequences, calibration_length)
        quantized = _calibrated(source, names, windows, bits, group_size, sym, desc_act, damp)
    else:
        quantized = {name: quantize_gptq(source.tensor(name), bits, group_size, sym) for name in names}
    config = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group_size,
        "desc_act": desc_act,
        "sym": sym,
        "checkpoint_format": "gptq",
        "lm_head": False,
        "true_sequential": False,
        "damp_percent": damp,
        "quantizer": f"tokenmill ({method})",
    }
    write_checkpoint(source, Path(out_dir), _tensors(source, quantized), config)
    return config


def _tensors(source: FloatCheckpoint, quantized: dict[str, GPTQTensors]) -> Iterator[tuple[str, torch.Tensor]]:
    for name in source.names():
        if name in quantized:
            yield from quantized[name].state_dict(name.removesuffix(".weight")).items()
        else:
            yield name, source.tensor(name)


def _calibrated(source: FloatCheckpoint, names: list[str], windows: torch.Tensor, bits: int, group_size: int,
                sym: bool, desc_act: bool, damp: float) -> dict[str, GPTQTensors]:
    def quantize_linear(name: str, weight: torch.Tensor, hessian: torch.Tensor) -> tuple[GPTQTensors, torch.Tensor]:
        tensors = gptq_quantize(weight, hessian, bits, group_size, sym, desc_act, damp)
        return tensors, tensors.dequantized

    return quantize_layer_by_layer(source, names, windows, quantize_linear)
