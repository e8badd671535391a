"""The GGUF kernel for layers dequantized at load: a plain ``F.linear`` on the float weight."""

from __future__ import annotations

from typing import Any, ClassVar

import torch.nn.functional as F

from tokenmill.layers.onednn_linear import OneDnnLinearKernel
from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel


class GGUFDequantizedKernel(QuantKernel):
    """Runs layers whose GGUF blocks were expanded to the compute dtype while loading (the fast path
    where memory allows, e.g. on CPUs)."""

    name = "gguf-dequantized"
    plain_weight = True
    gguf_layout: ClassVar[str] = "dequantize"  # what GGUFQuantizer.create_weights builds for this kernel

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Refuses only when the quantizer is pinned to the packed layout."""
        if getattr(quantizer, "mode", "dequantize") == "packed":
            return "the GGUF quantizer is pinned to the packed layout (gguf mode 'packed')"
        return None

    def apply(self, layer: Any, x: Any, bias: Any | None) -> Any:
        """``x @ weight.T + bias``."""
        return F.linear(x, layer.weight, bias)


class GGUFDequantizedOneDnnKernel(OneDnnLinearKernel):
    """Dequantized-at-load GGUF layers through oneDNN linear (chosen where a platform prefers it)."""

    name = "gguf-dequantized-onednn"
    gguf_layout: ClassVar[str] = "dequantize"

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """The dequantized layout's condition plus oneDNN's (CPU, float32/bfloat16)."""
        return (GGUFDequantizedKernel.supports(quantizer, spec, device_type, caps)
                or super().supports(quantizer, spec, device_type, caps))
