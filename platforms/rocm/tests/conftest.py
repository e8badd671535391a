"""A simulated ROCm machine: torch.version.hip set and torch.cuda answering for AMD GPUs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


class SimulatedRocm:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.calls: list[tuple] = []
        self.initialised = False

    def build(self, hip: str | None = "6.3.42131", cuda: str | None = None) -> SimulatedRocm:
        self.monkeypatch.setattr(torch.version, "hip", hip)
        self.monkeypatch.setattr(torch.version, "cuda", cuda)
        return self

    def devices(self, count: int, arch: str = "gfx942:sramecc+:xnack-", name: str = "AMD Instinct MI300X",
                total: int = 192 << 30, free: int = 190 << 30) -> SimulatedRocm:
        self.build()

        def properties(index: int = 0) -> SimpleNamespace:
            if not self.initialised:
                raise AssertionError("get_device_properties initialises HIP; the probe must not call it")
            return SimpleNamespace(name=name, total_memory=total, gcnArchName=arch)

        patches = {
            "device_count": lambda: count,
            "is_initialized": lambda: self.initialised,
            "get_device_properties": properties,
            "mem_get_info": lambda index=None: (free, total),
            "set_device": lambda index: self._record("set_device", index),
            "synchronize": lambda index=None: self._record("synchronize", index),
            "manual_seed_all": lambda seed: self._record("manual_seed_all", seed),
        }
        for attribute, value in patches.items():
            self.monkeypatch.setattr(torch.cuda, attribute, value)
        return self

    def _record(self, *call) -> None:
        self.calls.append(call)
        if call[0] == "set_device":
            self.initialised = True


@pytest.fixture
def simulated_rocm(monkeypatch: pytest.MonkeyPatch) -> SimulatedRocm:
    for variable in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)
    return SimulatedRocm(monkeypatch)
