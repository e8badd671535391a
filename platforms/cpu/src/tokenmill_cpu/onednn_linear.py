"""OneDnnLinearKernel: the CPU platform's linear kernel for plain float weights, through oneDNN with
each weight reordered once.

torch's default CPU GEMM re-packs the weight on every call; oneDNN's linear on a weight reordered at
load into its blocked layout does not. The result is the same float math in a different summation
order. The platform offers it through ``Platform.linear_kernels`` (full-precision layers, and layers
a format dequantizes at load as that format's ``<kernel>+onednn-linear``) and prefers it by name, so
the reference platform keeps plain ``F.linear`` as the oracle. Bias-free layers first offer their
rows to the platform's ``SmallBatchLinear`` (decode steps), when the platform has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill_cpu.small_batch_linear import SmallBatchLinear

_DTYPES = ("float32", "bfloat16")
_BATCH_HINT = 64


def onednn_unavailable() -> str | None:
    """Why oneDNN linear cannot run in this torch build, or None."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build lacks mkldnn._linear_pointwise"
    return None


def _no_small_batch_linear() -> SmallBatchLinear | None:
    return None


class OneDnnLinearKernel(QuantKernel):
    """``x @ W.T + b`` with ``W`` reordered once for oneDNN (CPU, float32 / bfloat16)."""

    name = "onednn-linear"
    plain_weight = True
    small_batch_linear: ClassVar[Callable[[], SmallBatchLinear | None]] = staticmethod(_no_small_batch_linear)

    @classmethod
    def using(cls, small_batch_linear: Callable[[], SmallBatchLinear | None]) -> type[OneDnnLinearKernel]:
        """This kernel with ``small_batch_linear()`` (asked once per layer, when the layer is built) as
        the source of its decode-step products."""
        return type(cls.__name__, (cls,), {"__doc__": cls.__doc__, "small_batch_linear": staticmethod(small_batch_linear)})

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """CPU tensors in float32 or bfloat16, with oneDNN in the torch build."""
        if device_type != "cpu":
            return f"oneDNN linear runs on the CPU, not {device_type}"
        if spec.dtype not in _DTYPES:
            return f"dtype {spec.dtype} not supported (supports {', '.join(_DTYPES)})"
        return onednn_unavailable()

    def __init__(self) -> None:
        self._small_batch = type(self).small_batch_linear()

    def process_weights_after_loading(self, layer: Any) -> None:
        """Reorder ``layer.weight`` into oneDNN's layout (kept beside it: a tied head shares ``weight``),
        unless ``SmallBatchLinear`` covers every row count of this bias-free layer: then no copy is kept,
        and one is made only if oneDNN ever runs."""
        small = self._small_batch
        if getattr(layer, "bias", None) is None and small is not None and small.covers(layer.weight):
            layer.onednn_weight, layer.onednn_source = None, None
            return
        self._reorder(layer)

    @staticmethod
    def _reorder(layer: Any) -> None:
        layer.onednn_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), _BATCH_HINT)
        layer.onednn_source = layer.weight.data_ptr()

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ weight.T (+ bias)``: ``SmallBatchLinear`` when it takes these rows of a bias-free layer,
        else oneDNN (reordering first if the weight changed since, or was never reordered)."""
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        small = self._small_batch
        if small is not None and bias is None:
            out = small(rows, layer.weight)
            if out is not None:
                return out.reshape(*shape[:-1], out.shape[-1])
        if getattr(layer, "onednn_source", None) != layer.weight.data_ptr():
            self._reorder(layer)
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), layer.onednn_weight, bias, "none", [], "")
        return out.reshape(*shape[:-1], out.shape[-1])
