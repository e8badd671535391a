"""``tokenmill quantize``: float Hugging Face checkpoints rewritten in a quantization format.

Each format's own distribution does the quantizing, in its quantizer's ``quantize_checkpoint``
classmethod (written with ``tokenmill.plugin_api.quantize_tools``), found through plugin discovery
(``formats``).
"""

from tokenmill.quantize.formats import format_options, quantize_model, writable_formats

__all__ = ["format_options", "quantize_model", "writable_formats"]
