"""CudaPlatform.probe on simulated machines and on this one."""

from __future__ import annotations

import pytest
import torch

from tokenmill.plugin_api import DeviceInfo, ProbeResult
from tokenmill_cuda.platform import CudaPlatform


def test_cpu_build_of_torch_scores_zero(simulated_cuda):
    simulated_cuda.build(cuda=None, hip=None)
    result = CudaPlatform.probe()
    assert result.score == 0
    assert result.reasons[0].startswith("torch is a CPU build")


def test_rocm_build_of_torch_scores_zero(simulated_cuda):
    simulated_cuda.build(cuda=None, hip="6.3.42131")
    result = CudaPlatform.probe()
    assert result.score == 0
    assert "torch built for ROCm" in result.reasons[0]


@pytest.mark.parametrize("mask, count, expected", [
    ("", 0, ProbeResult(0, ("no CUDA device visible (CUDA_VISIBLE_DEVICES='')",))),
    ("0,1", 2, ProbeResult(100, ("CUDA 12.8 with 2 device(s)",), (DeviceInfo(0, "cuda:0"), DeviceInfo(1, "cuda:1")))),
])
def test_devices_are_counted_without_initialising_cuda(simulated_cuda, monkeypatch, mask, count, expected):
    """A mask that hides every device is named; visible devices are listed by index alone."""
    simulated_cuda.devices(count)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    assert CudaPlatform.probe() == expected


def test_device_details_once_cuda_is_initialised(simulated_cuda):
    simulated_cuda.devices(1, cc=(8, 0), name="NVIDIA A100-SXM4-40GB", total=40 << 30)
    simulated_cuda.initialised = True
    (device,) = CudaPlatform.probe().devices
    assert (device.name, device.total_memory) == ("NVIDIA A100-SXM4-40GB", 40 << 30)
    assert device.extra["compute_capability"] == "8.0"


def test_this_machine_has_no_cuda():
    result = CudaPlatform.probe()
    if torch.version.cuda is None:
        assert result.score == 0 and len(result.reasons) == 1 and "\n" not in result.reasons[0]
    else:
        assert result.score in (0, 100)
