"""GPTQ's integer grid on core's error-feedback solver (``tokenmill.plugin_api.quantize_tools.error_feedback``):
``bits``-bit values with a scale and zero point per group of ``group_size`` input columns, in the
GPTQ checkpoint layout.

A group's scale and zero point are set when its first column is reached, from the group's
columns as the error updates have left them (AutoGPTQ's arithmetic: the range always includes 0;
symmetric zeros are ``2**(bits-1)``; scales are rounded to float16 before use, as stored). With
act order, groups are consecutive in processing order, which ``g_idx`` records (``desc_act``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tokenmill.plugin_api.quantize_tools import column_order, quantize_with_error_feedback
from tokenmill_quant_gptq.bitpack import pack_bits
from tokenmill_quant_gptq.quantize import GPTQTensors


def group_parameters(columns: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) per output row for a group of weight columns ``[out, size]``: scale float32
    (float16-representable), zero int64."""
    maxq = (1 << bits) - 1
    low = columns.amin(dim=1).clamp(max=0)
    high = columns.amax(dim=1).clamp(min=0)
    if sym:
        high = torch.maximum(low.abs(), high)
        low = torch.where(low < 0, -high, low)
    empty = (low == 0) & (high == 0)
    low, high = torch.where(empty, -1.0, low), torch.where(empty, 1.0, high)
    scale = ((high - low) / maxq).to(torch.float16).to(torch.float32)
    if sym:
        zero = torch.full_like(scale, (maxq + 1) // 2, dtype=torch.int64)
    else:
        zero = torch.round(-low / scale).clamp(0, maxq).to(torch.int64)
    return scale, zero


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, bits: int = 4, group_size: int = 128,
                  sym: bool = True, act_order: bool = False, damp: float = 0.01, zero_offset: int = 1) -> GPTQTensors:
    """Quantize ``weight`` [out, in] against ``hessian`` [in, in]; returns the checkpoint tensors
    (``zero_offset`` 1 writes GPTQ v1 zeros) and the float weights they encode."""
    out_features, in_features = weight.shape
    size = in_features if group_size == -1 else group_size
    groups = -(-in_features // size)
    maxq = (1 << bits) - 1
    q = torch.zeros(out_features, in_features, dtype=torch.int64)  # in processing order
    scales = torch.zeros(groups, out_features)
    zeros = torch.zeros(groups, out_features, dtype=torch.int64)

    def round_column(position: int, values: torch.Tensor, pending: Callable[[int], torch.Tensor]) -> torch.Tensor:
        group = position // size
        if position % size == 0:
            scales[group], zeros[group] = group_parameters(pending(size), bits, sym)
        scale, zero = scales[group], zeros[group]
        q[:, position] = torch.clamp(torch.round(values / scale) + zero, 0, maxq)
        return (q[:, position] - zero) * scale

    order = column_order(hessian, act_order)
    dequantized = quantize_with_error_feedback(weight, hessian, round_column, order, damp)
    unpermute = torch.argsort(order)
    return GPTQTensors(
        qweight=pack_bits(q[:, unpermute].T, bits, dim=0),
        qzeros=pack_bits((zeros - zero_offset) % (1 << bits), bits, dim=1),
        scales=scales.to(torch.float16),
        g_idx=(torch.arange(in_features) // size)[unpermute].to(torch.int32),
        dequantized=dequantized,
    )
