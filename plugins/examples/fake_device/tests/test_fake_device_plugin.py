"""What the tutorial claims about the example plugin, beyond the testkit's generic checks."""

from __future__ import annotations

import pytest
import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill_fake_device.attention import FakeDeviceAttentionBackend
from tokenmill_fake_device.kernels import FakeInt8ReferenceKernel, FakeInt8ScaledMMKernel
from tokenmill_fake_device.platform import ENV_VAR, FakeDevicePlatform
from tokenmill_fake_device.quantizer import FakeInt8Quantizer, quantize_per_channel
from tokenmill_testkit import AttentionCase


@pytest.mark.parametrize(("value", "score"), [(None, 0), ("0", 0), ("1", 80)])
def test_probe_reads_the_environment_variable(monkeypatch, value, score):
    if value is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, value)
    result = FakeDevicePlatform.probe()
    assert result.score == score
    assert ENV_VAR in result.reasons[0]


def test_backend_runs_only_where_the_family_tag_is():
    spec = AttentionCase(4, 2, 64).spec("float32")
    assert FakeDeviceAttentionBackend.validate(spec, "cpu", FakeDevicePlatform(0).capabilities.families) == []
    assert FakeDeviceAttentionBackend.validate(spec, "cpu", ()) != []
    assert FakeDeviceAttentionBackend.validate(AttentionCase(4, 2, 64, kv_cache_dtype="fp8").spec("float32"), "cpu",
                                               ("fakedev",)) == ["kv-cache dtype fp8 not supported"]


def test_detect_reads_quant_method():
    assert FakeInt8Quantizer.detect({"quantization_config": {"quant_method": "fakeint8"}}, "") == 1.0
    assert FakeInt8Quantizer.detect({"quantization_config": {"quant_method": "gptq"}}, "") == 0.0
    assert FakeInt8Quantizer.detect({}, "") == 0.0


def test_fast_kernel_runs_only_on_the_fakedev_family():
    spec = LinearSpec("proj", 64, 96, (96,), False, "float32")
    quantizer = FakeInt8Quantizer()
    assert FakeInt8ScaledMMKernel.supports(quantizer, spec, "cpu", FakeDevicePlatform(0).capabilities) is None
    assert "'fakedev' family" in FakeInt8ScaledMMKernel.supports(quantizer, spec, "cpu", PlatformCapabilities())
    assert FakeInt8ReferenceKernel.supports(quantizer, spec, "cpu", PlatformCapabilities()) is None


@pytest.mark.parametrize("kernel_cls", [FakeInt8ScaledMMKernel, FakeInt8ReferenceKernel])
def test_quantized_layer_approximates_the_float_layer(kernel_cls):
    """A checkpoint made by quantize_per_channel, loaded into create_weights' parameters, computes
    the original layer to within int8 rounding."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator)
    bias = torch.randn(96, generator=generator)
    x = torch.randn(3, 64, generator=generator)
    layer = torch.nn.Module()
    FakeInt8Quantizer().create_weights(layer, LinearSpec("proj", 64, 96, (32, 64), True, "float32"))
    quantized, scale = quantize_per_channel(weight)
    layer.weight.copy_(quantized)
    layer.weight_scale.copy_(scale)
    kernel = kernel_cls()
    kernel.process_weights_after_loading(layer)
    expected = torch.nn.functional.linear(x, weight, bias)
    error = (kernel.apply(layer, x, bias) - expected).abs().max()
    assert error < 0.02 * expected.abs().max()
