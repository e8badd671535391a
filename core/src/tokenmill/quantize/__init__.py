"""``tokenmill quantize``: float Hugging Face checkpoints rewritten in a quantization format.

Each format's own distribution does the quantizing, in its quantizer's ``quantize_checkpoint``
classmethod (written with ``tokenmill.plugin_api.quantize_tools``), found through plugin discovery
(``formats``). ``tokenmill export`` writes the float checkpoint a quantizer starts from when the model
is a self-contained file such as the bundled GGUF (``float_export``).
"""

from tokenmill.quantize.float_export import export_float_checkpoint
from tokenmill.quantize.formats import format_options, quantize_model, writable_formats

__all__ = ["export_float_checkpoint", "format_options", "quantize_model", "writable_formats"]
