"""The LayerKernels hook: build_model hands a platform's kernels to RMSNorm, rotary and SiluAndMul; a
kernel's result replaces the PyTorch computation and a declined call (None) falls back to it."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from tokenmill.layers.activation import SiluAndMul
from tokenmill.layers.context import ModelBuildContext
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryAngles
from tokenmill.loader.model_loader import build_model
from tokenmill.plugin_api import LayerKernels


class Recording(LayerKernels):
    """Declines every call but records it; ``answer`` makes rms_norm return a marker instead."""

    name = "recording"

    def __init__(self, answer=None):
        self.calls, self.answer = [], answer

    def rms_norm(self, x, weight, eps, residual=None):
        self.calls.append("rms_norm")
        return self.answer

    def rotary(self, query, key, cos, sin):
        self.calls.append("rotary")

    def silu_and_mul(self, x):
        self.calls.append("silu_and_mul")


def test_build_model_attaches_the_kernels_to_every_small_layer():
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    kernels = Recording()
    model = build_model(config, ModelBuildContext(dtype=torch.float32, layer_kernels=kernels))
    layers = [m for m in model.modules() if isinstance(m, (RMSNorm, SiluAndMul))] + [model.model.rotary]
    assert len(layers) == 2 * 3 + 1 + 1 and all(m.kernels is kernels for m in layers)
    assert build_model(config, ModelBuildContext(dtype=torch.float32)).model.norm.kernels is None


def test_declined_calls_fall_back_and_results_are_used():
    torch.manual_seed(0)
    kernels, norm = Recording(), RMSNorm(8, 1e-5)
    x, residual = torch.randn(3, 8), torch.randn(3, 8)
    plain = norm(x, residual)
    norm.kernels = kernels
    assert all(torch.equal(a, b) for a, b in zip(norm(x, residual), plain, strict=True))
    act = SiluAndMul()
    act.kernels = kernels
    assert torch.equal(act(x), SiluAndMul()(x))
    q, k, cos, sin = torch.randn(3, 2, 8), torch.randn(3, 1, 8), torch.randn(3, 1, 4), torch.randn(3, 1, 4)
    assert torch.equal(RotaryAngles(cos, sin, 8, kernels).apply(q, k)[0], RotaryAngles(cos, sin, 8).apply(q, k)[0])
    assert kernels.calls == ["rms_norm", "silu_and_mul", "rotary"]
    norm.kernels = Recording(answer="fused")
    assert norm(x) == "fused"
