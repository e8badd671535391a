"""``tokenmill quantize``: float Hugging Face checkpoints rewritten in a quantization format.

Core reads the float checkpoint (``FloatCheckpoint``), writes the output directory
(``write_checkpoint``) and provides calibration data (``calibration_windows``), a layer-by-layer
runner (``LayerwiseRunner``, ``quantize_layer_by_layer``) and GPTQ's error-feedback solver for any
rounding grid (``quantize_with_error_feedback``); each format's own distribution does the
quantizing, in its quantizer's ``quantize_checkpoint`` classmethod, found through plugin discovery
(``formats``).
"""

from tokenmill.quantize.calibration import DEFAULT_LENGTH, DEFAULT_SEQUENCES, calibration_text, calibration_windows
from tokenmill.quantize.checkpoint_writer import write_checkpoint
from tokenmill.quantize.error_feedback import (
    HessianAccumulator,
    column_order,
    one_thread,
    quantize_with_error_feedback,
)
from tokenmill.quantize.float_checkpoint import FloatCheckpoint
from tokenmill.quantize.formats import format_options, quantize_model, writable_formats
from tokenmill.quantize.layerwise import LayerwiseRunner, quantize_layer_by_layer

__all__ = [
    "DEFAULT_LENGTH",
    "DEFAULT_SEQUENCES",
    "FloatCheckpoint",
    "HessianAccumulator",
    "LayerwiseRunner",
    "calibration_text",
    "calibration_windows",
    "column_order",
    "format_options",
    "one_thread",
    "quantize_layer_by_layer",
    "quantize_model",
    "quantize_with_error_feedback",
    "writable_formats",
    "write_checkpoint",
]
