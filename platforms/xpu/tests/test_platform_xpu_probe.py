"""XpuPlatform on simulated Intel GPUs and on this machine."""

from __future__ import annotations

import pytest
import torch

from tokenmill_xpu.platform import XpuPlatform


def test_this_machine_has_no_xpu():
    result = XpuPlatform.probe()
    if getattr(torch.version, "xpu", None) is None:
        assert result.score == 0 and result.reasons[0].startswith("torch is built without XPU support")


def test_xpu_build_without_devices_scores_zero(simulated_xpu):
    simulated_xpu.devices(0)
    assert XpuPlatform.probe().reasons == ("no XPU device visible",)


def test_devices_are_counted_without_initialising_xpu(simulated_xpu):
    simulated_xpu.devices(2)
    result = XpuPlatform.probe()
    assert result.score == 100 and result.reasons[0] == "XPU (SYCL 20250101) with 2 device(s)"
    assert [d.name for d in result.devices] == ["xpu:0", "xpu:1"]


def test_device_details_once_xpu_is_initialised(simulated_xpu):
    simulated_xpu.devices(1)
    simulated_xpu.initialised = True
    (device,) = XpuPlatform.probe().devices
    assert (device.name, device.total_memory) == ("Intel(R) Data Center GPU Max 1550", 64 << 30)


def test_activated_platform(simulated_xpu):
    simulated_xpu.devices(2)
    platform = XpuPlatform(1)
    platform.activate()
    assert ("set_device", 1) in simulated_xpu.calls
    assert platform.ipex is None and platform.ipex_note is None  # not installed here
    caps = platform.capabilities
    assert caps.dtypes == ("bfloat16", "float16", "float32") and caps.int8_dot
    assert caps.collectives == ("xccl", "gloo") and caps.families == ("triton", "xpu")
    assert platform.distributed_backend == "xccl"
    assert platform.config_defaults({"dtype": "auto"}) == {"dtype": "bfloat16", "gpu_memory_utilization": 0.9}
    assert (platform.memory_info().total, platform.memory_info().free) == (64 << 30, 60 << 30)
    platform.seed(5)
    platform.synchronize()
    assert ("manual_seed_all", 5) in simulated_xpu.calls and ("synchronize", 1) in simulated_xpu.calls
    assert platform.describe() == "xpu:1 (Intel(R) Data Center GPU Max 1550)"


def test_gpu_without_xmx_prefers_float16(simulated_xpu):
    simulated_xpu.devices(1, name="Intel(R) UHD Graphics", xmx=False)
    platform = XpuPlatform(0)
    platform.activate()
    assert platform.capabilities.dtypes == ("float16", "bfloat16", "float32")
    assert not platform.capabilities.int8_dot


def test_activate_rejects_a_missing_device(simulated_xpu):
    simulated_xpu.devices(1)
    with pytest.raises(ValueError, match="XPU device 4 does not exist"):
        XpuPlatform(4).activate()
