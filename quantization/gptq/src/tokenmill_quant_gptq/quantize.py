"""Round-to-nearest quantization into the GPTQ storage format (AutoGPTQ's quantizer arithmetic,
without GPTQ's error-compensating updates): the building block of ``tokenmill quantize`` and of
the tests' checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill_quant_gptq.bitpack import pack_bits


@dataclass(frozen=True)
class GPTQTensors:
    """One layer in GPTQ's checkpoint layout, and the float weights it encodes."""

    qweight: torch.Tensor  # int32 [in * bits / 32, out]
    qzeros: torch.Tensor  # int32 [groups, out * bits / 32]
    scales: torch.Tensor  # float16 [groups, out]
    g_idx: torch.Tensor  # int32 [in]
    dequantized: torch.Tensor  # float32 [out, in], what a correct kernel multiplies by

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under checkpoint names ``<prefix>.qweight`` etc."""
        return {f"{prefix}.{name}": getattr(self, name) for name in ("qweight", "qzeros", "scales", "g_idx")}


def quantize_gptq(
    weight: torch.Tensor,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = True,
    act_order: torch.Tensor | None = None,
    zero_offset: int = 1,
) -> GPTQTensors:
    """Quantize ``weight`` [out, in]; ``act_order`` (a permutation of the input rows) assigns groups
    in that order, as ``desc_act`` does; ``zero_offset`` 1 writes the v1 format (``zero - 1``)."""
    w = weight.detach().to(torch.float32).T  # [in, out]
    in_features, out_features = w.shape
    size = in_features if group_size == -1 else group_size
    order = torch.arange(in_features) if act_order is None else act_order.long()
    g_idx = torch.empty(in_features, dtype=torch.int64)
    g_idx[order] = torch.arange(in_features) // size
    groups = -(-in_features // size)
    maxq = (1 << bits) - 1

    index = g_idx[:, None].expand(-1, out_features)
    low = torch.zeros(groups, out_features).scatter_reduce(0, index, w, "amin")
    high = torch.zeros(groups, out_features).scatter_reduce(0, index, w, "amax")
    if sym:
        high = torch.maximum(low.abs(), high)
        low = torch.where(low < 0, -high, low)
    empty = (low == 0) & (high == 0)
    low, high = torch.where(empty, -1.0, low), torch.where(empty, 1.0, high)
    scales = ((high - low) / maxq).to(torch.float16)
    if sym:
        zeros = torch.full((groups, out_features), (maxq + 1) // 2, dtype=torch.int64)
    else:
        zeros = torch.round(-low / scales.float()).clamp(0, maxq).to(torch.int64)

    row_scales, row_zeros = scales.float()[g_idx], zeros[g_idx]
    q = torch.clamp(torch.round(w / row_scales) + row_zeros, 0, maxq).to(torch.int64)
    dequantized = ((q - row_zeros).float() * row_scales).T.contiguous()
    stored_zeros = (zeros - zero_offset) % (1 << bits)
    return GPTQTensors(
        qweight=pack_bits(q, bits, dim=0),
        qzeros=pack_bits(stored_zeros, bits, dim=1),
        scales=scales,
        g_idx=g_idx.to(torch.int32),
        dequantized=dequantized,
    )
