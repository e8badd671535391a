"""A simulated CUDA machine: the torch queries the CUDA platform makes, answered by fixtures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenmill_testkit.simulated_device import SimulatedDeviceModule


class SimulatedCuda(SimulatedDeviceModule):
    """Patches torch.version and torch.cuda so the platform sees ``count`` GPUs of capability ``cc``."""

    def build(self, cuda: str | None = "12.8", hip: str | None = None) -> SimulatedCuda:
        self.monkeypatch.setattr(torch.version, "cuda", cuda)
        self.monkeypatch.setattr(torch.version, "hip", hip)
        return self

    def devices(self, count: int, cc: tuple[int, int] = (9, 0), name: str = "NVIDIA H100 80GB HBM3",
                total: int = 80 << 30, free: int = 79 << 30) -> SimulatedCuda:
        self.build()
        self.simulate(count, SimpleNamespace(name=name, total_memory=total, major=cc[0], minor=cc[1]), free, total,
                      get_device_capability=lambda index=None: cc, get_device_name=lambda index=None: name)
        return self


@pytest.fixture
def simulated_cuda(monkeypatch: pytest.MonkeyPatch) -> SimulatedCuda:
    return SimulatedCuda(monkeypatch, "cuda", "CUDA")
