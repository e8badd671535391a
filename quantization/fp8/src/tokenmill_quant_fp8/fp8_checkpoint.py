"""``tokenmill quantize --format fp8``: a float checkpoint rewritten with e4m3 decoder linear
weights, ``quant_method: fp8`` and dynamic activation scaling. Scales are per output channel
(``weight_scale`` ``[out, 1]``), or, with ``weight_block_size``, per block (``weight_scale_inv``,
the layout transformers' fine-grained FP8 reads as well). ``method="rtn"`` rounds each weight to
the nearest e4m3 value; ``method="gptq"`` rounds with GPTQ's error feedback (core's solver),
layer by layer on calibration text, which roughly halves the perplexity cost of fp8 on small
models."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tokenmill.plugin_api.quantize_tools import (
    DEFAULT_LENGTH,
    DEFAULT_SEQUENCES,
    FloatCheckpoint,
    calibration_text,
    calibration_windows,
    column_order,
    quantize_layer_by_layer,
    quantize_with_error_feedback,
    write_checkpoint,
)
from tokenmill_quant_fp8.quantize import E4M3_MAX, FP8Tensors, quantize_fp8

METHODS = ("rtn", "gptq")


def quantize_checkpoint(model_dir: str, out_dir: str, *, weight_block_size: int | None = None, method: str = "rtn",
                        desc_act: bool = False, calibration_file: str | None = None,
                        calibration_sequences: int = DEFAULT_SEQUENCES, calibration_length: int = DEFAULT_LENGTH,
                        damp: float = 0.1) -> dict[str, Any]:
    """Write ``model_dir``'s decoder linears as fp8 e4m3 to ``out_dir``; returns the
    ``quantization_config`` written."""
    if weight_block_size is not None and weight_block_size <= 0:
        raise ValueError(f"fp8 block size {weight_block_size} must be positive")
    if method not in METHODS:
        raise ValueError(f"fp8 method {method!r} is not one of {', '.join(METHODS)}")
    if method == "rtn" and desc_act:
        raise ValueError("act order (--desc-act) orders columns by activation statistics: it needs --method gptq")
    block = None if weight_block_size is None else (weight_block_size, weight_block_size)
    source = FloatCheckpoint(model_dir)
    names = source.linear_weights()
    if method == "gptq":
        windows = calibration_windows(source.tokenizer(), calibration_text(calibration_file), calibration_sequences,
                                      calibration_length)

        def quantize_linear(name: str, weight: torch.Tensor, hessian: torch.Tensor) -> tuple[FP8Tensors, torch.Tensor]:
            tensors = fp8_error_feedback(weight, hessian, block, desc_act, damp)
            return tensors, tensors.dequantized

        quantized = quantize_layer_by_layer(source, names, windows, quantize_linear)
    else:
        quantized = {name: _rtn(source.tensor(name), block) for name in names}
    config: dict[str, Any] = {"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": None}
    if block is not None:
        config["weight_block_size"] = list(block)
    scale_name = "weight_scale" if block is None else "weight_scale_inv"
    write_checkpoint(source, Path(out_dir), _tensors(source, quantized, scale_name), config)
    return config


def fp8_error_feedback(weight: torch.Tensor, hessian: torch.Tensor, block: tuple[int, int] | None = None,
                       act_order: bool = False, damp: float = 0.1) -> FP8Tensors:
    """e4m3 codes for ``weight`` [out, in] rounded with GPTQ's error feedback against ``hessian``;
    the scales (per channel, or per ``block``) are those of round-to-nearest on the original weight."""
    reference = _rtn(weight, block)
    out_features, in_features = weight.shape
    if block is None:
        expanded = reference.scale.expand(out_features, in_features)
    else:
        expanded = reference.scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
        expanded = expanded[:out_features, :in_features]
    order = column_order(hessian, act_order)
    scales = expanded[:, order]
    codes = torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn)  # in processing order

    def round_column(position: int, values: torch.Tensor, pending: Callable[[int], torch.Tensor]) -> torch.Tensor:
        scale = scales[:, position]
        codes[:, position] = (values / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return codes[:, position].to(torch.float32) * scale

    dequantized = quantize_with_error_feedback(weight, hessian, round_column, order, damp)
    return FP8Tensors(weight=codes[:, torch.argsort(order)], scale=reference.scale, dequantized=dequantized)


def _rtn(weight: torch.Tensor, block: tuple[int, int] | None) -> FP8Tensors:
    return quantize_fp8(weight, "channel") if block is None else quantize_fp8(weight, "block", block)


def _tensors(source: FloatCheckpoint, quantized: dict[str, FP8Tensors],
             scale_name: str) -> Iterator[tuple[str, torch.Tensor]]:
    for name in source.names():
        if name in quantized:
            yield from quantized[name].state_dict(name.removesuffix(".weight"), scale_name).items()
        else:
            yield name, source.tensor(name)
