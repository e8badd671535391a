"""The GGUF kernel for layers dequantized at load: a plain ``F.linear`` on the float weight.

Being a plain-weight kernel, a platform's own linear kernel may stand in for it (``Platform.linear_kernels``,
e.g. the CPU's ``gguf-dequantized+onednn-linear``), with the layer created in this kernel's layout."""

from __future__ import annotations

from typing import Any, ClassVar

import torch.nn.functional as F

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

