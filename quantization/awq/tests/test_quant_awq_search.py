"""AWQ's activation-aware scale search: its rounding is ``quantize_awq``'s, the chosen scales beat
plain rounding when a few input channels carry large activations, and models outside the llama
layout are refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tokenmill.plugin_api.quantize_tools import FloatCheckpoint
from tokenmill_quant_awq.awq_search import GRID, awq_search, fake_quantize, search_scales
from tokenmill_quant_awq.quantize import quantize_awq


def test_fake_quantize_is_quantize_awq():
    weight = torch.randn(48, 256) * 0.1
    assert torch.equal(fake_quantize(weight, 64), quantize_awq(weight, 64).dequantized)


def test_scales_protect_channels_with_large_activations():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(512, 128, generator=generator)
    inputs[:, :4] *= 30  # a few outlier channels, as in real decoder layers
    weights = [torch.randn(64, 128, generator=generator) * 0.05, torch.randn(32, 128, generator=generator) * 0.05]
    stacked = torch.cat(weights)
    scales = search_scales(inputs[:256], inputs.abs().mean(0), weights, 32)
    assert scales.shape == (128,) and (scales > 0).all()
    assert scales[:4].min() > scales[4:].max()  # the outlier channels are scaled up before rounding
    torch.testing.assert_close((scales.max() * scales.min()).sqrt(), torch.tensor(1.0))

    def error(s):
        return ((inputs @ (fake_quantize(stacked * s, 32) / s - stacked).T) ** 2).mean()

    assert error(scales) < 0.7 * error(torch.ones(128))
    assert GRID == 20


def test_models_outside_the_llama_layout_are_refused(tmp_path):
    save_file({"model.layers.0.mlp.fc1.weight": torch.zeros(64, 32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma2"}))
    source = FloatCheckpoint(tmp_path)
    with pytest.raises(ValueError, match="knows the llama layer layout .* not 'gemma2'; use --method rtn"):
        awq_search(source, source.linear_weights(), torch.zeros(1, 4, dtype=torch.int64), 32)
