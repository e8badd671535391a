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
from tokenmill.plugin_api.compressed_tensors import compressed_tensors_format
from tokenmill.plugin_api.fused_shards import quantized_whole, shard_span
from tokenmill.plugin_api.layer_parameters import layer_parameter, register_parameters
from tokenmill_quant_gptq.bitpack import packed_length
from tokenmill_quant_gptq.compressed_tensors_config import PACK_QUANTIZED, PackQuantizedScheme
from tokenmill_quant_gptq.compressed_tensors_kernel import CompressedTensorsPackTorchKernel
from tokenmill_quant_gptq.shard_loaders import BitPackedShardLoader, SharedGroupIndexLoader


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
        return quantized_whole(spec, self.scheme.quantizes)

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register the parameters listed in the module docstring."""
        scheme, bits = self.scheme, self.scheme.bits
        group_size = scheme.group_size or spec.in_features
        if scheme.group_size is not None and spec.in_features % group_size:
            raise ValueError(f"{spec.prefix}: {spec.in_features} inputs are not a multiple of group size {group_size}")
        groups = spec.in_features // group_size
        params = {
            "weight_packed": layer_parameter(
                torch.zeros(spec.out_features, packed_length(spec.in_features, bits), dtype=torch.int32), output_dim=0),
            "weight_scale": layer_parameter(torch.zeros(spec.out_features, groups, dtype=torch.float32), output_dim=0),
            "weight_shape": layer_parameter(torch.zeros(len(spec.output_sizes), 2, dtype=torch.int64),
                                            weight_loader=_WeightShapeLoader(spec)),
        }
        if not scheme.symmetric:
            params["weight_zero_point"] = layer_parameter(
                torch.zeros(packed_length(spec.out_features, bits), groups, dtype=torch.int32), output_dim=0,
                weight_loader=BitPackedShardLoader(spec, bits, dim=0))
        if scheme.group_actorder:
            params["weight_g_idx"] = layer_parameter(torch.arange(spec.in_features, dtype=torch.int32) // group_size,
                                                     weight_loader=SharedGroupIndexLoader(spec, groups))
        register_parameters(layer, params)
        layer.ct_scheme = scheme
        layer.ct_group_size = group_size

    def describe(self) -> str:
        """The scheme in one line."""
        return self.scheme.describe()


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
