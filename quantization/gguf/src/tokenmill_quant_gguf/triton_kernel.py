"""``gguf-packed-triton``: packed GGUF layers of Q8_0, Q4_0 and Q4_1 blocks run by a Triton kernel
that dequantizes inside the matmul (see ``triton_matmul``), on every device Triton compiles for.
Importing this module does not import triton; the kernel is compiled (or, under
``TRITON_INTERPRET=1``, interpreted) on first use."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill.plugin_api.triton import tile_kernel_unavailable
from tokenmill_quant_gguf.ggml_type import GGMLType

BLOCK_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1)


class GGUFPackedTritonKernel(QuantKernel):
    """Packed GGUF weights (raw blocks in ``qweight``, row runs in ``gguf_segments``) multiplied by
    one Triton launch per run of rows of one type."""

    name = "gguf-packed-triton"
    gguf_layout: ClassVar[str] = "packed"  # what GGUFQuantizer.create_weights builds for this kernel

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Needs a device Triton compiles for, a float compute dtype, shards of Q8_0, Q4_0 or Q4_1
        blocks, and a quantizer not pinned to dequantize at load."""
        reason = tile_kernel_unavailable(device_type, caps, spec.dtype)
        if reason is not None:
            return reason
        if getattr(quantizer, "mode", "packed") == "dequantize":
            return "the GGUF quantizer is pinned to dequantize at load (gguf mode 'dequantize')"
        others = sorted({t.name for t in quantizer.shard_types(spec)} - {t.name for t in BLOCK_TYPES})
        if others:
            return f"{', '.join(others)} blocks: this kernel reads {', '.join(t.name for t in BLOCK_TYPES)} only"
        return None

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias``, one launch per row run of ``layer.gguf_segments``."""
        from tokenmill_quant_gguf.triton_matmul import gguf_matmul_into

        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = rows.new_empty(rows.shape[0], layer.qweight.shape[0])
        for first, end, ggml_type in layer.gguf_segments:
            gguf_matmul_into(out[:, first:end], rows, layer.qweight[first:end], ggml_type)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
