"""Round-to-nearest quantization into AWQ's GEMM layout (AutoAWQ's ``pseudo_quantize_tensor``
arithmetic, without AWQ's activation-aware scaling search): for ``tokenmill quantize`` and tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill_quant_awq.packing import pack_int4


@dataclass(frozen=True)
class AWQTensors:
    """One layer in AWQ's checkpoint layout, and the float weights it encodes."""

    qweight: torch.Tensor  # int32 [in, out / 8]
    qzeros: torch.Tensor  # int32 [groups, out / 8]
    scales: torch.Tensor  # float16 [groups, out]
    dequantized: torch.Tensor  # float32 [out, in]

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under checkpoint names ``<prefix>.qweight`` etc."""
        return {f"{prefix}.{name}": getattr(self, name) for name in ("qweight", "qzeros", "scales")}


def quantize_awq(weight: torch.Tensor, group_size: int = 128) -> AWQTensors:
    """Quantize ``weight`` [out, in] to 4 bits with a scale and zero point per group of inputs."""
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"{in_features} inputs are not a multiple of group size {group_size}")
    grouped = weight.detach().to(torch.float32).reshape(out_features, -1, group_size)
    high, low = grouped.amax(-1, keepdim=True), grouped.amin(-1, keepdim=True)
    scales = ((high - low).clamp(min=1e-5) / 15).to(torch.float16)
    zeros = torch.clamp(-torch.round(low / scales.float()), 0, 15)
    q = torch.clamp(torch.round(grouped / scales.float()) + zeros, 0, 15)
    dequantized = ((q - zeros) * scales.float()).reshape(out_features, in_features)
    return AWQTensors(
        qweight=pack_int4(q.reshape(out_features, in_features).T.to(torch.int32)),
        qzeros=pack_int4(zeros[..., 0].T.to(torch.int32)),
        scales=scales[..., 0].T.contiguous(),
        dequantized=dequantized,
    )
