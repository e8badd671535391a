"""compressed-tensors ``pack-quantized`` checkpoints (llm-compressor's W4A16 / W8A16 presets): the
same dense bit packing as GPTQ, transposed.

Parameters, under the checkpoint's names (fused shards stacked along ``output_dim = 0``):

* ``weight_packed`` int32 ``[out, in * bits / 32]``: signed weights plus ``2**(bits-1)``, packed
  along the input dimension;
* ``weight_scale`` ``[out, groups]`` (one group per output channel for the "channel" strategy);
* ``weight_zero_point`` int32 ``[out * bits / 32, groups]`` (asymmetric only): signed zero points
  plus ``2**(bits-1)``, packed along the output dimension;
* ``weight_shape`` ``[shards, 2]``: each shard's ``(out, in)``, checked while loading;
* ``weight_g_idx`` int32 ``[in]`` (``actorder: group`` only).

``W = (q - zero_point) * scale``, with the scale and zero point of input ``i``'s group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, Quantizer, QuantKernel
from tokenmill_quant_gptq.bitpack import packed_length
from tokenmill_quant_gptq.compressed_tensors_config import (
    PACK_QUANTIZED,
    PackQuantizedScheme,
    compressed_tensors_format,
)
from tokenmill_quant_gptq.compressed_tensors_kernel import CompressedTensorsPackTorchKernel
from tokenmill_quant_gptq.shard_loaders import BitPackedShardLoader, SharedGroupIndexLoader, shard_span

# Fused linear layers of the llama family and the checkpoint modules they stack.
FUSED_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class CompressedTensorsPackQuantizer(Quantizer):
    """``quant_method: compressed-tensors`` with ``format: pack-quantized`` (int2..int8 weights)."""

    name = "compressed-tensors-pack"
    api_version = (2, 0)

    def __init__(self, scheme: PackQuantizedScheme) -> None:
        self.scheme = scheme

    @classmethod
    def detect(cls, hf_config: Mapping[str, Any], model_path: str) -> float:
        """1.0 for a compressed-tensors config whose format is ``pack-quantized``."""
        return 1.0 if compressed_tensors_format(hf_config) == PACK_QUANTIZED else 0.0

    @classmethod
    def from_config(cls, hf_config: Mapping[str, Any], model_path: str) -> CompressedTensorsPackQuantizer:
        """Parse the single config group (weight-only integer quantization)."""
        if compressed_tensors_format(hf_config) != PACK_QUANTIZED:
            raise ValueError(f"{model_path}: not a compressed-tensors pack-quantized checkpoint")
        return cls(PackQuantizedScheme.from_config(hf_config["quantization_config"]))

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """The torch reference only."""
        return (CompressedTensorsPackTorchKernel,)

    def is_quantized(self, spec: LinearSpec) -> bool:
        """Whether the scheme's targets (minus ``ignore``) cover the layer's checkpoint modules."""
        covered = {self.scheme.quantizes(module) for module in shard_modules(spec)}
        if len(covered) > 1:
            raise ValueError(f"{spec.prefix}: the checkpoint quantizes only some of the shards fused into this layer")
        return covered.pop()

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register the parameters listed in the module docstring."""
        scheme, bits = self.scheme, self.scheme.bits
        group_size = scheme.group_size or spec.in_features
        if scheme.group_size is not None and spec.in_features % group_size:
            raise ValueError(f"{spec.prefix}: {spec.in_features} inputs are not a multiple of group size {group_size}")
        groups = spec.in_features // group_size
        packed = _parameter(torch.zeros(spec.out_features, packed_length(spec.in_features, bits), dtype=torch.int32))
        packed.output_dim = 0
        scale = _parameter(torch.zeros(spec.out_features, groups, dtype=torch.float32))
        scale.output_dim = 0
        shape = _parameter(torch.zeros(len(spec.output_sizes), 2, dtype=torch.int64))
        shape.weight_loader = _WeightShapeLoader(spec)
        params = {"weight_packed": packed, "weight_scale": scale, "weight_shape": shape}
        if not scheme.symmetric:
            zero_point = _parameter(torch.zeros(packed_length(spec.out_features, bits), groups, dtype=torch.int32))
            zero_point.output_dim = 0
            zero_point.weight_loader = BitPackedShardLoader(spec, bits, dim=0)
            params["weight_zero_point"] = zero_point
        if scheme.group_actorder:
            g_idx = _parameter(torch.arange(spec.in_features, dtype=torch.int32) // group_size)
            g_idx.weight_loader = SharedGroupIndexLoader(spec, groups)
            params["weight_g_idx"] = g_idx
        for name, param in params.items():
            layer.register_parameter(name, param)
        layer.ct_scheme = scheme
        layer.ct_group_size = group_size

    def describe(self) -> str:
        """The scheme in one line."""
        return self.scheme.describe()


def shard_modules(spec: LinearSpec) -> list[str]:
    """The checkpoint module paths a (possibly fused) layer loads."""
    parent, _, leaf = spec.prefix.rpartition(".")
    shards = FUSED_SHARDS.get(leaf)
    if shards is not None and len(shards) == len(spec.output_sizes):
        return [f"{parent}.{shard}" for shard in shards]
    return [spec.prefix]


def _parameter(tensor: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(tensor, requires_grad=False)


class _WeightShapeLoader:
    """Checks each shard's stored ``(out, in)`` against the layer and records it."""

    def __init__(self, spec: LinearSpec) -> None:
        self.spec = spec

    def __call__(self, param: torch.Tensor, loaded: torch.Tensor, shard_index: int | None) -> None:
        index, _, size = shard_span(self.spec, shard_index)
        if tuple(int(v) for v in loaded.reshape(-1)) != (size, self.spec.in_features):
            raise ValueError(f"{self.spec.prefix}: shard {index} was quantized with shape "
                             f"{tuple(loaded.tolist())}, but the layer expects {(size, self.spec.in_features)}")
        param.data[index].copy_(loaded.reshape(-1))
