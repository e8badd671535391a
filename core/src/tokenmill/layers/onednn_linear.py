"""OneDnnLinearKernel: full-precision linear layers through oneDNN with weights reordered once.

torch's default CPU GEMM re-packs the weight on every call; oneDNN's linear with a weight reordered
at load into its blocked layout runs 2-4x faster at every batch size measured on x86 (the gap
vLLM-CPU exploits). The result is the same float32 math in a different summation order. It is
offered by the unquantized format (and formats that dequantize at load) but chosen only when the
platform prefers it by name (``quant_kernel_preference``), so the reference platform keeps plain
``F.linear`` as the oracle.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel

_DTYPES = ("float32", "bfloat16")
_BATCH_HINT = 64


def onednn_unavailable() -> str | None:
    """Why oneDNN linear cannot run in this torch build, or None."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build lacks mkldnn._linear_pointwise"
    return None


class OneDnnLinearKernel(QuantKernel):
    """``x @ W.T + b`` with ``W`` reordered once for oneDNN (CPU, float32 / bfloat16)."""

    name = "onednn-linear"
    plain_weight = True

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """CPU tensors in float32 or bfloat16, with oneDNN in the torch build."""
        if device_type != "cpu":
            return f"oneDNN linear runs on the CPU, not {device_type}"
        if spec.dtype not in _DTYPES:
            return f"dtype {spec.dtype} not supported (supports {', '.join(_DTYPES)})"
        return onednn_unavailable()

    def process_weights_after_loading(self, layer: Any) -> None:
        """Reorder ``layer.weight`` into oneDNN's layout (kept beside it: a tied head shares ``weight``),
        unless the platform's ``small_batch_linear`` covers every row count of this bias-free layer
        (``small_batch_linear_covers``): then no copy is kept, and one is made only if oneDNN ever runs."""
        kernels = getattr(layer, "kernels", None)
        covers = getattr(kernels, "small_batch_linear_covers", None)
        if getattr(layer, "bias", None) is None and covers is not None and covers(layer.weight):
            layer.onednn_weight, layer.onednn_source = None, None
            return
        self._reorder(layer)

    @staticmethod
    def _reorder(layer: Any) -> None:
        layer.onednn_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), _BATCH_HINT)
        layer.onednn_source = layer.weight.data_ptr()

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ weight.T (+ bias)``: the platform's ``small_batch_linear`` when it takes these rows,
        else oneDNN (reordering first if the weight changed since, or was never reordered)."""
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        kernels = getattr(layer, "kernels", None)
        if kernels is not None and bias is None:
            out = kernels.small_batch_linear(rows, layer.weight)
            if out is not None:
                return out.reshape(*shape[:-1], out.shape[-1])
        if getattr(layer, "onednn_source", None) != layer.weight.data_ptr():
            self._reorder(layer)
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), layer.onednn_weight, bias, "none", [], "")
        return out.reshape(*shape[:-1], out.shape[-1])
