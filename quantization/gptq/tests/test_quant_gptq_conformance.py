"""The testkit's quantizer conformance suite run on the GPTQ format (act order, 4-bit, g128)."""

from __future__ import annotations

import torch

from tokenmill.plugin_api import PlatformCapabilities
from tokenmill_quant_gptq.quantizer import GPTQQuantizer
from tokenmill_testkit import QuantizerConformance


class TestGPTQConformance(QuantizerConformance):
    quantizer_cls = GPTQQuantizer
    hf_config = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}}
    capabilities = PlatformCapabilities(families=("triton",))  # the Triton kernel runs where --tokenmill-device allows

    def fill_weights(self, layer, spec, generator):
        """Random packed words and scales, and a valid act-order ``g_idx``."""
        super().fill_weights(layer, spec, generator)
        with torch.no_grad():
            layer.g_idx.copy_(torch.randperm(spec.in_features, generator=generator) // 128)
