"""A simulated Intel GPU machine and a simulated Intel Extension for PyTorch installation."""

from __future__ import annotations

import sys
from importlib import metadata
from types import SimpleNamespace

import pytest
import torch

from tokenmill_testkit.simulated_device import SimulatedDeviceModule
from tokenmill_xpu import ipex


class SimulatedXpu(SimulatedDeviceModule):
    """Patches torch.version.xpu and torch.xpu so the platform sees ``count`` Intel GPUs."""

    def devices(self, count: int, name: str = "Intel(R) Data Center GPU Max 1550", xmx: bool = True,
                bf16: bool = True, total: int = 64 << 30, free: int = 60 << 30) -> SimulatedXpu:
        self.monkeypatch.setattr(torch.version, "xpu", "20250101", raising=False)
        properties = SimpleNamespace(name=name, total_memory=total, has_fp16=True, has_bfloat16_conversions=bf16,
                                     has_subgroup_matrix_multiply_accumulate=xmx, is_integrated_gpu=False)
        self.simulate(count, properties, free, total, is_available=lambda: count > 0,
                      get_device_name=lambda index=None: name)
        return self


class SimulatedIpex:
    """An ``intel_extension_for_pytorch`` package on a temporary sys.path entry, with the version
    package metadata reports for it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
        self.monkeypatch = monkeypatch
        self.tmp_path = tmp_path

    def install(self, version: str, body: str) -> None:
        package = self.tmp_path / ipex.MODULE
        package.mkdir()
        (package / "__init__.py").write_text(body)
        self.monkeypatch.syspath_prepend(str(self.tmp_path))
        real_version = metadata.version

        def version_of(distribution: str) -> str:
            return version if distribution == ipex.DISTRIBUTION else real_version(distribution)

        self.monkeypatch.setattr(ipex.metadata, "version", version_of)


@pytest.fixture
def simulated_xpu(monkeypatch: pytest.MonkeyPatch) -> SimulatedXpu:
    return SimulatedXpu(monkeypatch, "xpu", "XPU")


@pytest.fixture
def simulated_ipex(monkeypatch: pytest.MonkeyPatch, tmp_path):
    yield SimulatedIpex(monkeypatch, tmp_path)
    sys.modules.pop(ipex.MODULE, None)
