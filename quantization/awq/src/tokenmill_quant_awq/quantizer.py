"""The AWQ format (AutoAWQ / llm-awq checkpoints, ``version: gemm``): 4-bit weights with a float16
scale and a 4-bit zero point per group of input rows and output column.

Parameters, under the checkpoint's names (fused shards along ``output_dim = 1``, where ``qweight``
and ``qzeros`` pack 8 columns per int32, ``pack_factor = 8``):

* ``qweight`` int32 ``[in, out / 8]``; ``qzeros`` int32 ``[groups, out / 8]`` (see ``packing``);
* ``scales`` float16 ``[groups, out]``.

``W[i, j] = (q[i, j] - zero[i // group_size, j]) * scales[i // group_size, j]``.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, QuantKernel
from tokenmill.plugin_api.checkpoint_writer import checkpoint_writer
from tokenmill.plugin_api.configured_quantizer import ConfiguredQuantizer
from tokenmill.plugin_api.layer_parameters import layer_parameter, register_parameters
from tokenmill_quant_awq import awq_checkpoint
from tokenmill_quant_awq.awq_config import SIDE_FILE, AWQConfig
from tokenmill_quant_awq.packing import PER_WORD
from tokenmill_quant_awq.torch_kernel import AWQTorchKernel
from tokenmill_quant_awq.triton_kernel import AWQTritonKernel


class AWQQuantizer(ConfiguredQuantizer):
    """AWQ checkpoints (``quant_method: awq``), run by a Triton kernel on GPUs and by the
    plain-PyTorch reference kernel elsewhere."""

    name = "awq"
    api_version = (2, 0)
    quant_method = "awq"
    side_file = SIDE_FILE  # AutoAWQ's
    settings_cls = AWQConfig  # group size; the layout must be 4-bit GEMM with zero points

    def __init__(self, config: AWQConfig | None = None) -> None:
        self.config = config or AWQConfig()

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """Triton (devices Triton compiles for), then the torch reference; platform plugins may
        prefer their own kernels."""
        return (AWQTritonKernel, AWQTorchKernel)

    def is_quantized(self, spec: LinearSpec) -> bool:
        """False for ``lm_head`` and ``modules_to_not_convert``."""
        if spec.prefix.rpartition(".")[2] == "lm_head":
            return False
        return not any(module in spec.prefix for module in self.config.modules_to_not_convert)

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register ``qweight``, ``qzeros`` and ``scales`` (see the module docstring)."""
        group_size = self.config.group_size
        if spec.in_features % group_size:
            raise ValueError(f"{spec.prefix}: {spec.in_features} inputs are not a multiple of group size {group_size}")
        if any(size % PER_WORD for size in spec.output_sizes):
            raise ValueError(f"{spec.prefix}: AWQ needs output sizes divisible by 8, got {spec.output_sizes}")
        groups = spec.in_features // group_size
        register_parameters(layer, {
            "qweight": layer_parameter(torch.zeros(spec.in_features, spec.out_features // PER_WORD, dtype=torch.int32),
                                       output_dim=1, pack_factor=PER_WORD),
            "qzeros": layer_parameter(torch.zeros(groups, spec.out_features // PER_WORD, dtype=torch.int32),
                                      output_dim=1, pack_factor=PER_WORD),
            "scales": layer_parameter(torch.zeros(groups, spec.out_features, dtype=torch.float16), output_dim=1),
        })
        layer.awq_group_size = group_size

    def describe(self) -> str:
        """``awq 4-bit g128 (gemm)``."""
        return f"awq 4-bit g{self.config.group_size} (gemm)"

    quantize_checkpoint = checkpoint_writer(awq_checkpoint.quantize_checkpoint)

