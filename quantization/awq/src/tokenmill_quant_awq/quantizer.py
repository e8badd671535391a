"""The AWQ format (AutoAWQ / llm-awq checkpoints, ``version: gemm``): 4-bit weights with a float16
scale and a 4-bit zero point per group of input rows and output column.

Parameters, under the checkpoint's names (fused shards along ``output_dim = 1``, where ``qweight``
and ``qzeros`` pack 8 columns per int32, ``pack_factor = 8``):

* ``qweight`` int32 ``[in, out / 8]``; ``qzeros`` int32 ``[groups, out / 8]`` (see ``packing``);
* ``scales`` float16 ``[groups, out]``.

``W[i, j] = (q[i, j] - zero[i // group_size, j]) * scales[i // group_size, j]``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, Quantizer, QuantKernel
from tokenmill.plugin_api.layer_parameters import layer_parameter, register_parameters
from tokenmill.plugin_api.quantization_config import declares, read_quantization_config
from tokenmill_quant_awq import awq_checkpoint
from tokenmill_quant_awq.awq_config import SIDE_FILE, AWQConfig
from tokenmill_quant_awq.packing import PER_WORD
from tokenmill_quant_awq.torch_kernel import AWQTorchKernel
from tokenmill_quant_awq.triton_kernel import AWQTritonKernel


class AWQQuantizer(Quantizer):
    """AWQ checkpoints (``quant_method: awq``), run by a Triton kernel on GPUs and by the
    plain-PyTorch reference kernel elsewhere."""

    name = "awq"

    def __init__(self, config: AWQConfig | None = None) -> None:
        self.config = config or AWQConfig()

    @classmethod
    def detect(cls, hf_config: Mapping[str, Any], model_path: str) -> float:
        """1.0 when the quantization config says ``quant_method: awq`` (or AutoAWQ's
        ``quant_config.json`` sits next to the weights)."""
        return 1.0 if declares(hf_config, model_path, "awq", SIDE_FILE) else 0.0

    @classmethod
    def from_config(cls, hf_config: Mapping[str, Any], model_path: str) -> AWQQuantizer:
        """Parse group size and check the layout is 4-bit GEMM with zero points."""
        config = read_quantization_config(hf_config, model_path, SIDE_FILE, "awq")
        if config is None:
            raise ValueError(f"{model_path}: no AWQ quantization_config in config.json nor a quant_config.json")
        return cls(AWQConfig.from_dict(config))

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

    @classmethod
    @functools.wraps(awq_checkpoint.quantize_checkpoint)
    def quantize_checkpoint(cls, model_dir: str, out_dir: str, **options: Any) -> dict[str, Any]:
        """Write a float checkpoint as AWQ (GEMM, round-to-nearest) (see ``awq_checkpoint.quantize_checkpoint``)."""
        return awq_checkpoint.quantize_checkpoint(model_dir, out_dir, **options)

