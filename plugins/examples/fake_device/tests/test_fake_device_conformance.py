"""The example plugin run through the testkit: this file is what a vendor's test file looks like."""

from __future__ import annotations

import pytest

from tokenmill.plugin_api import PlatformCapabilities
from tokenmill_fake_device.attention import FakeDeviceAttentionBackend
from tokenmill_fake_device.platform import ENV_VAR, FakeDevicePlatform
from tokenmill_fake_device.quantizer import FakeInt8Quantizer
from tokenmill_testkit import AttentionBackendConformance, PlatformConformance, QuantizerConformance


class TestFakeDevicePlatform(PlatformConformance):
    platform_cls = FakeDevicePlatform

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def enabled(cls):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV_VAR, "1")
            yield


class TestFakeDevicePlatformDisabled(PlatformConformance):
    """Without the variable the probe scores 0: the static checks still run, the rest skip."""

    platform_cls = FakeDevicePlatform

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def disabled(cls):
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv(ENV_VAR, raising=False)
            yield


class TestFakeDeviceAttention(AttentionBackendConformance):
    backend_cls = FakeDeviceAttentionBackend
    device = "cpu"
    families = ("fakedev",)


class TestFakeInt8(QuantizerConformance):
    quantizer_cls = FakeInt8Quantizer
    hf_config = {"quantization_config": {"quant_method": "fakeint8"}}
    capabilities = PlatformCapabilities(families=("fakedev",))  # what supports() is told: our platform's
    required_kernels = ("fakeint8-scaled-mm",)  # gated by supports(): must run here, never be skipped
