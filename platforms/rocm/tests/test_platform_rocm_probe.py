"""RocmPlatform.probe on simulated machines and on this one."""

from __future__ import annotations

import torch

from tokenmill.plugin_api import DeviceInfo, ProbeResult
from tokenmill_rocm.platform import RocmPlatform


def test_cpu_build_of_torch_scores_zero(simulated_rocm):
    simulated_rocm.build(hip=None, cuda=None)
    assert RocmPlatform.probe().reasons[0].startswith("torch is a CPU build")
    assert RocmPlatform.probe().score == 0


def test_cuda_build_of_torch_scores_zero(simulated_rocm):
    simulated_rocm.build(hip=None, cuda="12.8")
    result = RocmPlatform.probe()
    assert result.score == 0 and "torch built for CUDA 12.8, not ROCm" in result.reasons[0]


def test_no_visible_gpu_names_the_visibility_variables(simulated_rocm, monkeypatch):
    simulated_rocm.devices(0)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")
    assert RocmPlatform.probe() == ProbeResult(0, ("no ROCm GPU visible (HIP_VISIBLE_DEVICES='')",))


def test_gpus_are_counted_without_initialising_hip(simulated_rocm):
    simulated_rocm.devices(8)
    devices = tuple(DeviceInfo(index, f"rocm:{index}") for index in range(8))
    assert RocmPlatform.probe() == ProbeResult(100, ("ROCm (HIP 6.3.42131) with 8 device(s)",), devices)


def test_device_details_once_hip_is_initialised(simulated_rocm):
    simulated_rocm.devices(1)
    simulated_rocm.initialised = True
    (device,) = RocmPlatform.probe().devices
    assert (device.name, device.extra["arch"]) == ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-")


def test_this_machine_has_no_rocm():
    result = RocmPlatform.probe()
    if torch.version.hip is None:
        assert result.score == 0 and len(result.reasons) == 1
