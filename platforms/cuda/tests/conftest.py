"""A simulated CUDA machine: the torch queries the CUDA platform makes, answered by fixtures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


class SimulatedCuda:
    """Patches torch.version and torch.cuda so the platform sees ``count`` GPUs of capability ``cc``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.calls: list[tuple] = []
        self.initialised = False

    def build(self, cuda: str | None = "12.8", hip: str | None = None) -> SimulatedCuda:
        self.monkeypatch.setattr(torch.version, "cuda", cuda)
        self.monkeypatch.setattr(torch.version, "hip", hip)
        return self

    def devices(self, count: int, cc: tuple[int, int] = (9, 0), name: str = "NVIDIA H100 80GB HBM3",
                total: int = 80 << 30, free: int = 79 << 30) -> SimulatedCuda:
        self.build()
        cuda = torch.cuda

        def properties(index: int = 0) -> SimpleNamespace:
            if not self.initialised:
                raise AssertionError("get_device_properties initialises CUDA; the probe must not call it")
            return SimpleNamespace(name=name, total_memory=total, major=cc[0], minor=cc[1])

        patches = {
            "device_count": lambda: count,
            "is_initialized": lambda: self.initialised,
            "get_device_properties": properties,
            "get_device_capability": lambda index=None: cc,
            "get_device_name": lambda index=None: name,
            "mem_get_info": lambda index=None: (free, total),
            "set_device": lambda index: self._record("set_device", index),
            "synchronize": lambda index=None: self._record("synchronize", index),
            "manual_seed_all": lambda seed: self._record("manual_seed_all", seed),
        }
        for attribute, value in patches.items():
            self.monkeypatch.setattr(cuda, attribute, value)
        return self

    def _record(self, *call) -> None:
        self.calls.append(call)
        if call[0] == "set_device":
            self.initialised = True


@pytest.fixture
def simulated_cuda(monkeypatch: pytest.MonkeyPatch) -> SimulatedCuda:
    return SimulatedCuda(monkeypatch)
