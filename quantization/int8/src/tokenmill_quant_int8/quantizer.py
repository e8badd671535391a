"""The INT8 format: symmetric int8 weights with float32 per-channel (or per-tensor) scales, run
weight-only (W8A16) or with int8 activations quantized per token (W8A8); see ``int8_scheme`` for
the two config shapes.

Parameters, under the checkpoint's names (fused shards along ``output_dim = 0``):

* ``weight`` int8 ``[out, in]``;
* ``weight_scale`` float32 ``[out, 1]``: per-channel scales, or a shard's per-tensor scalar filling
  its rows (``RowScaleLoader``);
* ``input_scale`` / ``input_zero_point`` ``[shards]`` (``per_shard``, optional): static activation
  parameters of compressed-tensors checkpoints, loaded but unused.
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
from tokenmill_quant_int8 import int8_checkpoint
from tokenmill_quant_int8.int8_scheme import INT_FORMATS, Int8Scheme
from tokenmill_quant_int8.w8a8_kernels import Int8IntMMKernel, Int8W8A8TorchKernel
from tokenmill_quant_int8.weight_only_kernel import Int8WeightOnlyTorchKernel


class INT8Quantizer(ConfiguredQuantizer):
    """int8 weights; W8A8 through ``torch._int_mm`` where the platform has int8 dot products."""

    name = "int8"
    api_version = (2, 0)
    quant_method = "int8"
    compressed_tensors_formats = INT_FORMATS
    settings_cls = Int8Scheme  # W8A8 vs W8A16 and the modules left in full precision

    def __init__(self, scheme: Int8Scheme | None = None) -> None:
        self.scheme = scheme or Int8Scheme()

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """W8A8: ``_int_mm`` then the exact torch emulation; W8A16: the weight-only torch kernel."""
        if self.scheme.w8a8:
            return (Int8IntMMKernel, Int8W8A8TorchKernel)
        return (Int8WeightOnlyTorchKernel,)

    def is_quantized(self, spec: LinearSpec) -> bool:
        """False for ignored modules (``lm_head`` among them unless a config says otherwise)."""
        return quantized_whole(spec, self.scheme.quantizes)

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register ``weight``, ``weight_scale`` and the optional activation parameters."""
        params = {
            "weight": layer_parameter(torch.zeros(spec.out_features, spec.in_features, dtype=torch.int8), output_dim=0),
            "weight_scale": layer_parameter(torch.ones(spec.out_features, 1, dtype=torch.float32),
                                            weight_loader=RowScaleLoader(spec)),
        }
        for name in ("input_scale", "input_zero_point"):
            params[name] = layer_parameter(torch.zeros(len(spec.output_sizes), dtype=torch.float32), per_shard=True,
                                           checkpoint_optional=True)
        register_parameters(layer, params)

    def describe(self) -> str:
        """W8A8 or W8A16, and the config it came from."""
        return self.scheme.describe()

    quantize_checkpoint = checkpoint_writer(int8_checkpoint.quantize_checkpoint)

