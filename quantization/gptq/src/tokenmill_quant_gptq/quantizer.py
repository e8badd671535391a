"""The GPTQ format (AutoGPTQ / GPTQModel / optimum checkpoints): 2, 3, 4 or 8-bit integer weights
with per-group scales and zero points, optionally in activation order (``desc_act`` + ``g_idx``).

Parameters, under the checkpoint's names (``out`` fused across shards along ``output_dim = 1``):

* ``qweight`` int32 ``[in * bits / 32, out]``: weights packed along the input dimension;
* ``qzeros`` int32 ``[groups, out * bits / 32]``: zero points packed along the output dimension
  (``pack_factor = 32 / bits``; 3-bit shards are placed by a ``weight_loader``);
* ``scales`` float16 ``[groups, out]``;
* ``g_idx`` int32 ``[in]``: each input row's group (optional in the checkpoint: ``i // group_size``);
  fused shards must agree on it, which they do since they share the layer input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, QuantKernel
from tokenmill.plugin_api.checkpoint_writer import checkpoint_writer
from tokenmill.plugin_api.configured_quantizer import ConfiguredQuantizer
from tokenmill.plugin_api.layer_parameters import layer_parameter, register_parameters
from tokenmill_quant_gptq import gptq_checkpoint
from tokenmill_quant_gptq.bitpack import packed_length
from tokenmill_quant_gptq.gptq_config import SIDE_FILE, GPTQConfig
from tokenmill_quant_gptq.shard_loaders import BitPackedShardLoader, SharedGroupIndexLoader
from tokenmill_quant_gptq.torch_kernel import GPTQTorchKernel
from tokenmill_quant_gptq.triton_kernel import GPTQTritonKernel


class GPTQQuantizer(ConfiguredQuantizer):
    """GPTQ checkpoints (``quant_method: gptq``), run by a Triton kernel on GPUs and by the
    plain-PyTorch reference kernel elsewhere."""

    name = "gptq"
    api_version = (2, 0)
    quant_method = "gptq"
    side_file = SIDE_FILE  # AutoGPTQ's

    def __init__(self, config: GPTQConfig | None = None) -> None:
        self.config = config or GPTQConfig()

    @classmethod
    def parse_settings(cls, hf_config: Mapping[str, Any], model_path: str) -> GPTQConfig:
        """Bits, group size, act order, symmetry and checkpoint format; Marlin repacks are refused."""
        config = cls.declared_config(hf_config, model_path)
        if config.get("is_marlin_format") or config.get("checkpoint_format") == "marlin":
            raise ValueError(f"{model_path}: Marlin-repacked GPTQ checkpoints are not supported; use the GPTQ original")
        return GPTQConfig.from_dict(config)

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """Triton (devices Triton compiles for), then the torch reference; platform plugins may
        prefer their own kernels."""
        return (GPTQTritonKernel, GPTQTorchKernel)

    def is_quantized(self, spec: LinearSpec) -> bool:
        """False for ``lm_head`` (unless the config quantized it) and for ``modules_to_not_convert``."""
        if spec.prefix.rpartition(".")[2] == "lm_head":
            return self.config.lm_head
        return not any(module in spec.prefix for module in self.config.modules_to_not_convert)

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register ``qweight``, ``qzeros``, ``scales`` and ``g_idx`` (see the module docstring)."""
        config, bits = self.config, self.config.bits
        if spec.in_features * bits % 32:
            raise ValueError(f"{spec.prefix}: {spec.in_features} inputs do not pack into whole {bits}-bit int32 words")
        for size in spec.output_sizes:
            if size * bits % 32:
                raise ValueError(f"{spec.prefix}: a shard of {size} outputs does not pack into whole {bits}-bit words")
        groups = config.num_groups(spec.in_features)
        whole_words = 32 % bits == 0  # else 3-bit shards are placed by a weight_loader
        group_size = spec.in_features if config.group_size == -1 else config.group_size
        register_parameters(layer, {
            "qweight": layer_parameter(torch.zeros(spec.in_features * bits // 32, spec.out_features, dtype=torch.int32),
                                       output_dim=1),
            "qzeros": layer_parameter(torch.zeros(groups, packed_length(spec.out_features, bits), dtype=torch.int32),
                                      output_dim=1, pack_factor=32 // bits if whole_words else None,
                                      weight_loader=None if whole_words else BitPackedShardLoader(spec, bits, dim=1)),
            "scales": layer_parameter(torch.zeros(groups, spec.out_features, dtype=torch.float16), output_dim=1),
            "g_idx": layer_parameter(torch.arange(spec.in_features, dtype=torch.int32) // group_size,
                                     checkpoint_optional=True, weight_loader=SharedGroupIndexLoader(spec, groups)),
        })
        layer.gptq_config = config

    def describe(self) -> str:
        """``gptq 4-bit g128 sym``-style summary."""
        return self.config.describe()

    quantize_checkpoint = checkpoint_writer(gptq_checkpoint.quantize_checkpoint)

