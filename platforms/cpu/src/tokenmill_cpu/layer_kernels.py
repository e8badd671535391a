"""CpuLayerKernels: RMSNorm (with its residual add), rotary embedding, SiluAndMul, row gathers and
greedy argmaxes as one C call each.

A decode step of a 30-layer model otherwise runs some 60 small tensor operations per layer outside
the matrix products; at one token each costs more in dispatch than in arithmetic. The kernels are
``kernels/layer_ops.c`` (built on first use by core's ``build_native_library``) and take float32
or bfloat16 rows whose last dimension is contiguous (bfloat16 rounded wherever PyTorch's bfloat16
operations round); anything else is declined (None) and runs core's PyTorch code. Being native calls,
they also let a dense model's decode steps be captured as CPU decode graphs. The decode steps' matrix
products are the platform's linear kernel's (``OneDnnLinearKernel`` with ``SmallBatchLinear``).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from tokenmill.plugin_api import LayerKernels
from tokenmill.plugin_api.native import build_failure, build_native_library, native_call
from tokenmill_cpu.greedy_head import GreedyHead, load_greedy_head
from tokenmill_cpu.kernels.dtypes import SUFFIXES, by_dtype
from tokenmill_cpu.panel_matmul import load_panel_matmul
from tokenmill_cpu.small_batch_linear import load_small_batch_matmul
from tokenmill_cpu.split_bf16_matmul import load_split_bf16_matmul

SOURCE = Path(__file__).parent / "kernels" / "layer_ops.c"


@lru_cache(maxsize=1)
def load_layer_ops() -> ctypes.CDLL:
    """The compiled library (NativeBuildError from core when there is no C compiler)."""
    library = build_native_library(SOURCE, "CPU layer kernels")
    pointer, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for suffix in SUFFIXES.values():
        rms_norm, rotary, silu_and_mul = (getattr(library, f"{name}_{suffix}")
                                          for name in ("rms_norm", "rotary", "silu_and_mul"))
        rms_norm.argtypes = [pointer, i64, pointer, i64, pointer, f32, i64, i64, pointer, pointer]
        rotary.argtypes = [pointer, i64, i64, pointer, i64, i64, i64, i64, i64, pointer, pointer, pointer, pointer]
        silu_and_mul.argtypes = [pointer, i64, i64, i64, pointer]
        for function in (rms_norm, rotary, silu_and_mul):
            function.restype = None
    library.gather_rows.argtypes = [pointer, i64, i64, pointer, i64, pointer]
    library.gather_rows.restype = i64
    return library


def layer_ops_unavailable() -> str | None:
    """Why the layer kernels (or the ``SmallBatchLinear`` products, built and refused with them) cannot be
    built or loaded here, or None."""
    return (build_failure(load_layer_ops) or build_failure(load_small_batch_matmul) or build_failure(load_panel_matmul)
            or build_failure(load_greedy_head) or build_failure(load_split_bf16_matmul))


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``x`` (float32 or bfloat16) as rows [T, last] with a unit inner stride, and the row stride (in
    elements); None otherwise."""
    if x.dtype not in SUFFIXES:
        return None
    if x.dim() == 2 and x.stride(1) == 1:
        return x, x.stride(0)
    if x.is_contiguous():
        rows = x.view(-1, x.shape[-1])
        return rows, rows.shape[1]
    return None


def _heads(x: torch.Tensor) -> int | None:
    """The row stride of ``x`` [T, heads, head_size] (float32 or bfloat16) whose heads are contiguous
    within a row."""
    if x.dtype not in SUFFIXES or x.dim() != 3:
        return None
    row_stride, head_stride, unit = x.stride()
    return row_stride if unit == 1 and head_stride == x.shape[2] else None


class CpuLayerKernels(LayerKernels):
    """Float32 and bfloat16 layer kernels in C; other dtypes and layouts decline to core's PyTorch code."""

    name = "cpu-layer-ops"

    def __init__(self, bf16_estimates: bool = False) -> None:
        """``bf16_estimates``: the CPU multiplies bfloat16 natively, so ``greedy_lm_head`` may estimate
        the logits of more than two rows in bfloat16 (elsewhere it declines them; one or two rows take
        int8 estimates on every CPU)."""
        self._library = load_layer_ops()
        self._greedy_head = GreedyHead(bf16_estimates)
        self._rms_norm, self._rotary, self._silu_and_mul = (by_dtype(self._library, name)
                                                            for name in ("rms_norm", "rotary", "silu_and_mul"))

    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any | None = None) -> Any | None:
        """Residual add and RMSNorm over float32 or bfloat16 rows (weight of the same dtype) in one pass."""
        rows = _rows(x)
        if rows is None or weight.dtype is not x.dtype or weight.stride(0) != 1:
            return None
        x2d, x_stride = rows
        count, hidden = x2d.shape
        function = self._rms_norm[x.dtype]
        normed = torch.empty(x.shape, dtype=x.dtype)
        if residual is None:
            native_call(function, x2d.data_ptr(), x_stride, None, 0, weight.data_ptr(), eps, count, hidden,
                        normed.data_ptr(), None)
            return normed
        residual_rows = _rows(residual)
        if residual_rows is None or residual.shape != x.shape or residual.dtype is not x.dtype:
            return None
        total = torch.empty(x.shape, dtype=x.dtype)
        native_call(function, x2d.data_ptr(), x_stride, residual_rows[0].data_ptr(), residual_rows[1],
                    weight.data_ptr(), eps, count, hidden, normed.data_ptr(), total.data_ptr())
        return normed, total

    def rotary(self, query: Any, key: Any, cos: Any, sin: Any) -> tuple[Any, Any] | None:
        """NeoX rotation of float32 or bfloat16 queries and keys (cos and sin of the same dtype), written
        to new contiguous tensors."""
        q_stride, k_stride = _heads(query), _heads(key)
        if q_stride is None or k_stride is None or query.shape[2] != key.shape[2] or query.shape[0] != key.shape[0]:
            return None
        if len({query.dtype, key.dtype, cos.dtype, sin.dtype}) != 1:
            return None
        if not cos.is_contiguous() or not sin.is_contiguous():
            return None
        count, _, head_size = query.shape
        rotary_dim = 2 * cos.shape[-1]
        if cos.numel() != count * cos.shape[-1] or rotary_dim > head_size:
            return None
        q_out = torch.empty(query.shape, dtype=query.dtype)
        k_out = torch.empty(key.shape, dtype=key.dtype)
        native_call(self._rotary[query.dtype], query.data_ptr(), q_stride, query.shape[1], key.data_ptr(), k_stride,
                    key.shape[1], count, head_size, rotary_dim, cos.data_ptr(), sin.data_ptr(), q_out.data_ptr(),
                    k_out.data_ptr())
        return q_out, k_out

    def silu_and_mul(self, x: Any) -> Any | None:
        """``silu(gate) * up`` over float32 or bfloat16 rows ``(gate, up)``."""
        rows = _rows(x)
        if rows is None or x.shape[-1] % 2:
            return None
        x2d, x_stride = rows
        count, width = x2d.shape
        out = torch.empty(*x.shape[:-1], width // 2, dtype=x.dtype)
        native_call(self._silu_and_mul[x.dtype], x2d.data_ptr(), x_stride, count, width // 2, out.data_ptr())
        return out

    def gather_rows(self, table: Any, indices: Any) -> Any | None:
        """``table[indices]`` by copying whole rows of a contiguous table; IndexError for an index
        outside it."""
        if table.dim() != 2 or not table.is_contiguous() or indices.dtype is not torch.int64 or indices.dim() != 1:
            return None
        if not indices.is_contiguous() or table.device.type != "cpu" or indices.device.type != "cpu":
            return None
        out = torch.empty(indices.shape[0], table.shape[1], dtype=table.dtype)
        refused = native_call(self._library.gather_rows, table.data_ptr(), table.shape[0],
                              table.shape[1] * table.element_size(), indices.data_ptr(), indices.shape[0],
                              out.data_ptr())
        if refused:
            raise IndexError(f"{refused} index(es) out of range for a table of {table.shape[0]} rows")
        return out

    def argmax_rows(self, logits: Any) -> Any | None:
        """Each float32 row's argmax in C, rows spread over the threads."""
        return self._greedy_head.argmax_rows(logits)

    def greedy_lm_head(self, hidden: Any, weight: Any) -> Any | None:
        """The argmax of a float32 LM head from int8 (one or two rows) or bfloat16 estimates and float32
        recomputation of the tokens still in contention (``GreedyHead``); more rows are declined without
        native bfloat16 products."""
        return self._greedy_head(hidden, weight)
