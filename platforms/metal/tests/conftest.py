"""A simulated Mac: macOS, torch.backends.mps and torch.mps answering as on Apple silicon."""

from __future__ import annotations

import pytest
import torch

from tokenmill_metal import platform as metal_platform


class SimulatedMac:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.calls: list[tuple] = []

    def build(self, macos: bool = True, built: bool = True, available: bool = True, macos_version: int = 15,
              name: str = "Apple M3 Max") -> SimulatedMac:
        mps_backend, mps = torch.backends.mps, torch.mps
        self.monkeypatch.setattr(metal_platform, "running_on_macos", lambda: macos)
        self.monkeypatch.setattr(metal_platform, "mac_ver", lambda: (f"{macos_version}.1", ("", "", ""), "arm64"))
        self.monkeypatch.setattr(mps_backend, "is_built", lambda: built)
        self.monkeypatch.setattr(mps_backend, "is_available", lambda: available)
        self.monkeypatch.setattr(mps_backend, "get_name", lambda: name, raising=False)
        self.monkeypatch.setattr(mps_backend, "is_macos_or_newer", lambda major, minor: macos_version >= major)
        self.monkeypatch.setattr(mps, "recommended_max_memory", lambda: 48 << 30)
        self.monkeypatch.setattr(mps, "driver_allocated_memory", lambda: 6 << 30)
        self.monkeypatch.setattr(mps, "synchronize", lambda: self.calls.append(("synchronize",)))
        self.monkeypatch.setattr(mps, "manual_seed", lambda seed: self.calls.append(("manual_seed", seed)))
        return self


@pytest.fixture
def simulated_mac(monkeypatch: pytest.MonkeyPatch) -> SimulatedMac:
    return SimulatedMac(monkeypatch)
