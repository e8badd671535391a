"""Memory acceptance of 4-bit weights: SmolLM2-135M written as 4-bit GPTQ by ``tokenmill quantize``
(the checkpoint of the perplexity test) and loaded by tokenmill keeps its linear layers packed.
Measured on parameter bytes (buffers such as rotary tables excluded): the quantized linear layers
against the float32 size of the same weights, and the whole model (float embedding tied to the LM
head, float norms) against the float32 model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.plugin_api.linear import Linear
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill_quant_gptq.quantizer import GPTQQuantizer

pytestmark = pytest.mark.slow

GPTQ_OPTIONS = ["--group-size", "32", "--no-sym", "--desc-act"]  # the perplexity test's configuration


def _float32_bytes(directory) -> int:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return sum(4 * torch.Size(handle.get_slice(n).get_shape()).numel() for n in handle.keys())


def test_packed_4bit_gptq_takes_at_most_35_percent_of_float32(quantized_model):
    import smollm2

    directory = quantized_model("gptq", GPTQ_OPTIONS)
    config = json.loads((directory / "config.json").read_text())
    quantizer = GPTQQuantizer.from_config(config, str(directory))
    build = ModelBuildContext(dtype=torch.float32, quantizer=quantizer, attention_backend=ReferenceAttentionBackend)
    model = build_model(config, build)
    load_weights(model, str(directory), quantizer)

    linears = [m for m in model.modules() if isinstance(m, Linear) and m.quantizer.name == "gptq"]
    assert len(linears) == 30 * 4  # qkv, o, gate_up, down per layer; the tied head stays float
    assert all(m.qweight.dtype == torch.int32 and not hasattr(m, "weight") for m in linears)
    linear_bytes = sum(p.numel() * p.element_size() for m in linears for p in m.parameters())
    linear_fp32 = sum(m.spec.in_features * m.spec.out_features * 4 for m in linears)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model_fp32 = _float32_bytes(smollm2.safetensors_dir())
    print(f"\n4-bit GPTQ SmolLM2-135M: linear layers {linear_bytes / 2**20:.1f} MiB of {linear_fp32 / 2**20:.1f} MiB "
          f"fp32 ({linear_bytes / linear_fp32:.1%}); whole model {model_bytes / 2**20:.1f} MiB of "
          f"{model_fp32 / 2**20:.1f} MiB fp32 ({model_bytes / model_fp32:.1%})")
    assert linear_bytes <= 0.35 * linear_fp32
    assert model_bytes <= 0.35 * model_fp32
