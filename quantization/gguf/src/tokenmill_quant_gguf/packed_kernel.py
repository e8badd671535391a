"""The reference kernel for packed GGUF layers: dequantize tiles of output rows inside the matmul.

The layer keeps the checkpoint's ggml blocks (``qweight``, uint8 ``[out_features, row_bytes]``) and
``gguf_segments``, one ``(first_row, end_row, ggml_type)`` per run of rows of one type (fused q/k/v
shards may differ in type). Every call dequantizes at most ``tile_elements`` weights at a time, so
the temporary memory is bounded however large the layer is.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill_quant_gguf.dequantize import dequantize


class GGUFPackedTorchKernel(QuantKernel):
    """Packed GGUF weights, dequantized per call in row tiles (plain PyTorch; any device)."""

    name = "gguf-packed-torch"
    gguf_layout: ClassVar[str] = "packed"  # what GGUFQuantizer.create_weights builds for this kernel
    tile_elements: ClassVar[int] = 1 << 22  # weights dequantized at once: 16 MiB of float32

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Refuses only when the quantizer is pinned to the dequantize-at-load layout."""
        if getattr(quantizer, "mode", "packed") == "dequantize":
            return "the GGUF quantizer is pinned to dequantize at load (gguf mode 'dequantize')"
        return None

    def apply(self, layer: Any, x: Any, bias: Any | None) -> Any:
        """``x @ W.T + bias`` with ``W`` expanded tile by tile from ``layer.qweight``."""
        in_features = x.shape[-1]
        rows = x.reshape(-1, in_features)
        out = rows.new_empty(rows.shape[0], layer.qweight.shape[0])
        tile = max(1, self.tile_elements // in_features)
        for first, end, ggml_type in layer.gguf_segments:
            width = ggml_type.row_bytes(in_features)
            for start in range(first, end, tile):
                stop = min(end, start + tile)
                weight = dequantize(layer.qweight[start:stop, :width], ggml_type, rows.dtype)
                out[:, start:stop] = rows @ weight.T
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
