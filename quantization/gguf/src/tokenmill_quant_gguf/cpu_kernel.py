"""GGUFPackedCpuKernel: packed GGUF layers multiplied straight from their ggml blocks on the CPU.

Decoding a small model on a CPU is bound by memory bandwidth, and a Q4_1 weight is 4.5 bits where
the dequantized float32 one is 32: ``kernels/gguf_matmul.c`` reads the blocks in place and expands
each to the float32 weights that dequantizing at load would give (scaled; the block's offset is
applied to the block's sum of activations), so the result differs from ``x @ W.T`` only in rounding
order. It serves Q4_0, Q4_1 and Q8_0 rows, eight tokens of the batch per pass over the weights:
measured on two Zen cores it reads a decode step's Q4_1 weights at ~20 GB/s (4x the float32 bytes
avoided) and still beats dequantizing tiles into torch's GEMM on 2048-token prefills. Other dtypes
take ``GGUFPackedTorchKernel``'s tile path.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import torch

from tokenmill.layers.native_calls import native_call
from tokenmill.layers.native_library import build_failure, build_native_library
from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.packed_kernel import GGUFPackedTorchKernel

SOURCE = Path(__file__).parent / "kernels" / "gguf_matmul.c"
NATIVE_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0)
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")


@lru_cache(maxsize=1)
def load_matmul() -> Any:
    """The compiled ``gguf_matmul_f32`` (NativeBuildError when there is no C compiler)."""
    function = build_native_library(SOURCE, "GGUF CPU matmul kernel").gguf_matmul_f32
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [pointer, i64, i64, pointer, i64, i64, ctypes.c_int, pointer, i64]
    function.restype = ctypes.c_int
    return function


def native_unavailable() -> str | None:
    """Why the C kernel cannot be built or loaded here, or None."""
    return build_failure(load_matmul)


class GGUFPackedCpuKernel(GGUFPackedTorchKernel):
    """Packed GGUF weights on the CPU: a C kernel over the raw blocks, in float32 (half-precision
    activations are widened on the way in and rounded back on the way out)."""

    name = "gguf-packed-cpu"
    gguf_layout: ClassVar[str] = "packed"

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """CPU, float32 / bfloat16 / float16 activations, the packed layout allowed, a C compiler; all
        of the layer's shards in Q4_0, Q4_1 or Q8_0 with whole blocks per row."""
        if device_type != "cpu":
            return f"the GGUF CPU kernel runs on the CPU, not {device_type}"
        if spec.dtype not in ACTIVATION_DTYPES:
            return f"dtype {spec.dtype} not supported ({', '.join(ACTIVATION_DTYPES)} activations only)"
        refused = super().supports(quantizer, spec, device_type, caps)
        if refused:
            return refused
        shard_types = getattr(quantizer, "shard_types", None)
        if shard_types is not None:
            others = sorted({t.name for t in shard_types(spec) if t not in NATIVE_TYPES})
            if others:
                return f"ggml types {', '.join(others)} are not read by the C kernel (Q4_0, Q4_1, Q8_0 only)"
        if spec.in_features % 32:
            return f"in_features {spec.in_features} is not a multiple of the 32-weight ggml block"
        return native_unavailable()

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` from the blocks in ``layer.qweight``, one C call per row segment."""
        if x.dtype is not torch.float32:
            wide = self.apply(layer, x.float(), bias.float() if bias is not None else None)
            return wide.to(x.dtype)
        in_features = x.shape[-1]
        rows = x if x.dim() == 2 else x.reshape(-1, in_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        qweight = layer.qweight
        count, out_features, row_bytes = rows.shape[0], qweight.shape[0], qweight.stride(0)
        out = rows.new_empty(count, out_features)
        matmul, x_pointer, w_pointer, y_pointer = load_matmul(), rows.data_ptr(), qweight.data_ptr(), out.data_ptr()
        for first, end, ggml_type in layer.gguf_segments:  # pointers to row `first` of the weights and of y
            status = native_call(matmul, x_pointer, count, in_features, w_pointer + first * row_bytes, row_bytes,
                                 end - first, int(ggml_type), y_pointer + 4 * first, out_features)
            if status != 0:
                raise ValueError(f"the GGUF CPU kernel cannot read {ggml_type.name} rows of {in_features} weights")
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out_features)
