"""The quantizer authoring tools: what a format's ``quantize_checkpoint`` is written with.

``tokenmill quantize`` calls the format's ``Quantizer.quantize_checkpoint(model_dir, out_dir,
**options)``; these tools read the float checkpoint (``FloatCheckpoint``), write the output
directory (``write_checkpoint``; ``write_safetensors_shards`` for tensors alone), provide calibration data (``calibration_text``,
``calibration_windows``), run a Hugging Face model layer by layer over it (``LayerwiseRunner``,
``quantize_layer_by_layer``) and solve GPTQ's error feedback for any rounding grid
(``quantize_with_error_feedback``, ``column_order``, ``HessianAccumulator``, ``one_thread``).
"""

from tokenmill.plugin_api.quantize_tools.calibration import (
    DEFAULT_LENGTH,
    DEFAULT_SEQUENCES,
    calibration_text,
    calibration_windows,
)
from tokenmill.plugin_api.quantize_tools.checkpoint_writer import (
    new_checkpoint_directory,
    write_checkpoint,
    write_safetensors_shards,
)
from tokenmill.plugin_api.quantize_tools.error_feedback import (
    HessianAccumulator,
    column_order,
    one_thread,
    quantize_with_error_feedback,
)
from tokenmill.plugin_api.quantize_tools.float_checkpoint import FloatCheckpoint
from tokenmill.plugin_api.quantize_tools.layerwise import LayerwiseRunner, quantize_layer_by_layer

__all__ = [
    "DEFAULT_LENGTH",
    "DEFAULT_SEQUENCES",
    "FloatCheckpoint",
    "HessianAccumulator",
    "LayerwiseRunner",
    "calibration_text",
    "calibration_windows",
    "column_order",
    "one_thread",
    "quantize_layer_by_layer",
    "quantize_with_error_feedback",
    "new_checkpoint_directory",
    "write_checkpoint",
    "write_safetensors_shards",
]
