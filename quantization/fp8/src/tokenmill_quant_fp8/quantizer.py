"""The FP8 format: e4m3 weights with float32 scales, from ``quant_method: fp8`` checkpoints and
compressed-tensors ``float-quantized`` ones (the same tensors under the same names).

Parameters, under the checkpoint's names (fused shards along ``output_dim = 0``):

* ``weight`` float8_e4m3fn ``[out, in]``;
* per-tensor or per-channel scales: ``weight_scale`` float32 ``[out, 1]``, one per output row (a
  shard's per-tensor scalar fills its rows), loaded by ``RowScaleLoader``;
* block scales: ``weight_scale_inv`` (fp8 configs) or ``weight_scale`` (compressed-tensors) float32
  ``[out / block_rows, in / block_cols]`` (``pack_factor = block_rows``); they multiply the weights;
* ``input_scale`` float32 ``[shards]`` (``per_shard``; optional): static activation scales, loaded
  but unused (the W8A8 kernels scale activations per token).

``W = weight * scale``.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, QuantKernel
from tokenmill.plugin_api.checkpoint_writer import checkpoint_writer
from tokenmill.plugin_api.configured_quantizer import ConfiguredQuantizer
from tokenmill.plugin_api.fused_shards import quantized_whole
from tokenmill.plugin_api.layer_parameters import layer_parameter, register_parameters
from tokenmill.plugin_api.scale_loaders import RowScaleLoader
from tokenmill_quant_fp8 import fp8_checkpoint
from tokenmill_quant_fp8.fp8_scheme import FLOAT_QUANTIZED, FP8Scheme
from tokenmill_quant_fp8.scaled_mm_kernel import FP8ScaledMMFnuzKernel, FP8ScaledMMKernel
from tokenmill_quant_fp8.torch_kernel import FP8TorchKernel


class FP8Quantizer(ConfiguredQuantizer):
    """fp8 e4m3 weights; W8A8 through ``torch._scaled_mm`` where the platform computes in fp8,
    weight-only dequantization elsewhere."""

    name = "fp8"
    api_version = (2, 0)
    quant_method = "fp8"
    compressed_tensors_formats = (FLOAT_QUANTIZED,)
    settings_cls = FP8Scheme  # the scale granularity and the modules left in full precision

    def __init__(self, scheme: FP8Scheme | None = None) -> None:
        self.scheme = scheme or FP8Scheme()

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """W8A8 (e4m3fn, then e4m3fnuz hardware), then the weight-only torch reference."""
        return (FP8ScaledMMKernel, FP8ScaledMMFnuzKernel, FP8TorchKernel)

    def is_quantized(self, spec: LinearSpec) -> bool:
        """False for ignored modules (``lm_head`` among them unless a config says otherwise)."""
        return quantized_whole(spec, self.scheme.quantizes)

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register ``weight``, the scale and ``input_scale`` (see the module docstring)."""
        weight = layer_parameter(torch.zeros(spec.out_features, spec.in_features, dtype=torch.float8_e4m3fn),
                                 output_dim=0)
        block = self.scheme.block
        if block is None:
            scale = layer_parameter(torch.ones(spec.out_features, 1, dtype=torch.float32),
                                    weight_loader=RowScaleLoader(spec))
            scale_name = "weight_scale"
        else:
            rows, cols = block
            if any(size % rows for size in spec.output_sizes):
                raise ValueError(f"{spec.prefix}: output shards {spec.output_sizes} are not multiples of the "
                                 f"{rows}-row scale blocks")
            scale = layer_parameter(torch.ones(spec.out_features // rows, -(-spec.in_features // cols),
                                               dtype=torch.float32), output_dim=0, pack_factor=rows)
            scale_name = self.scheme.scale_name
        input_scale = layer_parameter(torch.ones(len(spec.output_sizes), dtype=torch.float32), per_shard=True,
                                      checkpoint_optional=True)
        register_parameters(layer, {"weight": weight, scale_name: scale, "input_scale": input_scale})
        layer.fp8_block = block
        layer.fp8_scale_name = scale_name

    def describe(self) -> str:
        """The scale granularity and the config it came from."""
        return self.scheme.describe()

    quantize_checkpoint = checkpoint_writer(fp8_checkpoint.quantize_checkpoint)

