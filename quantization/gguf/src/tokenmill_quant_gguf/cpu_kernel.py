"""GGUFPackedCpuKernel: packed GGUF layers multiplied straight from their ggml blocks on the CPU.

Decoding a small model on a CPU is bound by memory bandwidth, and a Q4_1 weight is 4.5 bits where
the dequantized float32 one is 32: ``kernels/gguf_matmul.c`` reads the blocks in place and expands
each to the float32 weights that dequantizing at load would give, so the result differs from
``x @ W.T`` only in rounding order. It serves Q4_0, Q4_1 and Q8_0 rows. After loading, each row's
blocks are rearranged in place into the kernel's "CPU order" (the same bytes: the row's scales first,
then its quants with the nibbles placed so that a 16-byte load expands without byte shuffles).
Up to ``DEQUANTIZE_ROWS`` tokens go through the C kernel, eight per pass over the weights (two weight
rows at a time for one token, the rows ahead prefetched), so a decode step reads each block once.
Longer batches (prefills) dequantize tiles of rows (``TILE_WEIGHTS`` at a time) in C and multiply them
with torch's GEMM, so the float32 copy held at once stays one tile. Other dtypes take
``GGUFPackedTorchKernel``'s tile path.
"""

from __future__ import annotations

import ctypes
import threading
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer
from tokenmill.plugin_api.native import build_failure, build_native_library, native_call
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.packed_kernel import GGUFPackedTorchKernel

SOURCE = Path(__file__).parent / "kernels" / "gguf_matmul.c"
NATIVE_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0)
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")
DEQUANTIZE_ROWS = 24  # from this many tokens on, dequantized tiles and torch's GEMM beat the C kernel
TILE_WEIGHTS = 1 << 20  # weights dequantized at once: 4 MiB of float32 per thread's scratch tile
_scratch = threading.local()


@lru_cache(maxsize=1)
def load_library() -> SimpleNamespace:
    """The compiled kernels: ``matmul`` (``gguf_matmul_f32``), ``order`` (``gguf_cpu_order``) and
    ``dequantize`` (``gguf_dequantize_f32``); NativeBuildError when there is no C compiler."""
    library = build_native_library(SOURCE, "GGUF CPU matmul kernel")
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    matmul, order, dequantize = library.gguf_matmul_f32, library.gguf_cpu_order, library.gguf_dequantize_f32
    matmul.argtypes = [pointer, i64, i64, pointer, i64, i64, ctypes.c_int, pointer, i64]
    order.argtypes = [pointer, i64, i64, i64, ctypes.c_int]
    dequantize.argtypes = [pointer, i64, i64, i64, ctypes.c_int, pointer]
    for function in (matmul, order, dequantize):
        function.restype = ctypes.c_int
    return SimpleNamespace(matmul=matmul, order=order, dequantize=dequantize)


def native_unavailable() -> str | None:
    """Why the C kernel cannot be built or loaded here, or None."""
    return build_failure(load_library)


def cpu_ordered(qweight: torch.Tensor, segments: Any, in_features: int) -> torch.Tensor:
    """``qweight`` (uint8 [out_features, row_bytes], checkpoint order) rearranged in place into the C
    kernel's order, segment by segment; returns it."""
    order, row_bytes = load_library().order, qweight.stride(0)
    for first, end, ggml_type in segments:
        if order(qweight.data_ptr() + first * row_bytes, row_bytes, end - first, in_features, int(ggml_type)) != 0:
            raise ValueError(f"the GGUF CPU kernel cannot order {ggml_type.name} rows of {in_features} weights")
    return qweight


def order_stamp(qweight: torch.Tensor) -> tuple[str, int | None]:
    """What ``layer.gguf_cpu_order`` holds once ``qweight`` is ordered: its in-place version then (the C
    kernel's writes do not count; a weight loader's ``copy_`` does), None for an inference tensor."""
    return ("cpu order", None if qweight.is_inference() else qweight._version)


def _check_read(status: int, ggml_type: GGMLType, in_features: int) -> None:
    """ValueError when a C call refused ``ggml_type`` rows of ``in_features`` weights (status -1)."""
    if status != 0:
        raise ValueError(f"the GGUF CPU kernel cannot read {ggml_type.name} rows of {in_features} weights")


def scratch_tile(rows: int, in_features: int) -> torch.Tensor:
    """This thread's float32 scratch tile viewed as [rows, in_features], grown when too small."""
    tile = getattr(_scratch, "tile", None)
    if tile is None or tile.numel() < rows * in_features:
        tile = _scratch.tile = torch.empty(rows * in_features, dtype=torch.float32)
    return tile[: rows * in_features].view(rows, in_features)


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

    def process_weights_after_loading(self, layer: Any) -> None:
        """Rearrange the loaded blocks in place into the C kernel's order (same bytes per row), unless
        they already are: ``layer.gguf_cpu_order`` stamps the ordered bytes with ``qweight``'s
        in-place version, so blocks loaded again afterwards are ordered again."""
        if getattr(layer, "gguf_cpu_order", None) != order_stamp(layer.qweight):
            cpu_ordered(layer.qweight.data, layer.gguf_segments, layer.spec.in_features)
            layer.gguf_cpu_order = order_stamp(layer.qweight)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` from the blocks in ``layer.qweight``: one C call per row segment, or
        dequantized tiles and torch's GEMM for ``DEQUANTIZE_ROWS`` tokens or more. A layer whose blocks
        are not (or no longer) ordered is ordered into a copy on every call."""
        if x.dtype is not torch.float32:
            wide = self.apply(layer, x.float(), bias.float() if bias is not None else None)
            return wide.to(x.dtype)
        in_features = x.shape[-1]
        rows = x if x.dim() == 2 else x.reshape(-1, in_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        qweight = layer.qweight
        if getattr(layer, "gguf_cpu_order", None) != order_stamp(qweight):
            qweight = cpu_ordered(qweight.detach().clone(), layer.gguf_segments, in_features)
        count, out_features = rows.shape[0], qweight.shape[0]
        out = rows.new_empty(count, out_features)
        if count >= DEQUANTIZE_ROWS:
            self._dequantized_product(qweight, layer.gguf_segments, rows, out)
        else:
            self._native_product(qweight, layer.gguf_segments, rows, out)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], out_features)

    @staticmethod
    def _native_product(qweight: torch.Tensor, segments: Any, rows: torch.Tensor, out: torch.Tensor) -> None:
        matmul, row_bytes = load_library().matmul, qweight.stride(0)
        (count, in_features), out_features = rows.shape, out.shape[1]
        x_pointer, w_pointer, y_pointer = rows.data_ptr(), qweight.data_ptr(), out.data_ptr()
        for first, end, ggml_type in segments:  # pointers to row `first` of the weights and of y
            status = native_call(matmul, x_pointer, count, in_features, w_pointer + first * row_bytes, row_bytes,
                                 end - first, int(ggml_type), y_pointer + 4 * first, out_features)
            _check_read(status, ggml_type, in_features)

    @staticmethod
    def _dequantized_product(qweight: torch.Tensor, segments: Any, rows: torch.Tensor, out: torch.Tensor) -> None:
        dequantize, row_bytes, in_features = load_library().dequantize, qweight.stride(0), rows.shape[1]
        tile_rows = max(1, TILE_WEIGHTS // in_features)
        for first, end, ggml_type in segments:
            for start in range(first, end, tile_rows):
                stop = min(end, start + tile_rows)
                tile = scratch_tile(stop - start, in_features)
                _check_read(dequantize(qweight.data_ptr() + start * row_bytes, row_bytes, stop - start, in_features,
                                       int(ggml_type), tile.data_ptr()), ggml_type, in_features)
                torch.mm(rows, tile.T, out=out[:, start:stop])
