"""A simulated ROCm machine: torch.version.hip set and torch.cuda answering for AMD GPUs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenmill_testkit.simulated_device import SimulatedDeviceModule


class SimulatedRocm(SimulatedDeviceModule):
    """Patches torch.version and torch.cuda so the platform sees ``count`` AMD GPUs of ``arch``."""

    def build(self, hip: str | None = "6.3.42131", cuda: str | None = None) -> SimulatedRocm:
        self.monkeypatch.setattr(torch.version, "hip", hip)
        self.monkeypatch.setattr(torch.version, "cuda", cuda)
        return self

    def devices(self, count: int, arch: str = "gfx942:sramecc+:xnack-", name: str = "AMD Instinct MI300X",
                total: int = 192 << 30, free: int = 190 << 30) -> SimulatedRocm:
        self.build()
        self.simulate(count, SimpleNamespace(name=name, total_memory=total, gcnArchName=arch), free, total)
        return self


@pytest.fixture
def simulated_rocm(monkeypatch: pytest.MonkeyPatch) -> SimulatedRocm:
    for variable in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)
    return SimulatedRocm(monkeypatch, "cuda", "HIP")
