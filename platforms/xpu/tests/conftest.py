"""A simulated Intel GPU machine and a simulated Intel Extension for PyTorch installation."""

from __future__ import annotations

import sys
from importlib import metadata
from types import SimpleNamespace

import pytest
import torch

from tokenmill_xpu import ipex


class SimulatedXpu:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.calls: list[tuple] = []
        self.initialised = False

    def devices(self, count: int, name: str = "Intel(R) Data Center GPU Max 1550", xmx: bool = True,
                bf16: bool = True, total: int = 64 << 30, free: int = 60 << 30) -> SimulatedXpu:
        self.monkeypatch.setattr(torch.version, "xpu", "20250101", raising=False)

        def properties(index: int = 0) -> SimpleNamespace:
            if not self.initialised:
                raise AssertionError("get_device_properties initialises XPU; the probe must not call it")
            return SimpleNamespace(name=name, total_memory=total, has_fp16=True, has_bfloat16_conversions=bf16,
                                   has_subgroup_matrix_multiply_accumulate=xmx, is_integrated_gpu=False)

        patches = {
            "device_count": lambda: count,
            "is_available": lambda: count > 0,
            "is_initialized": lambda: self.initialised,
            "get_device_properties": properties,
            "get_device_name": lambda index=None: name,
            "mem_get_info": lambda index=None: (free, total),
            "set_device": lambda index: self._record("set_device", index),
            "synchronize": lambda index=None: self._record("synchronize", index),
            "manual_seed_all": lambda seed: self._record("manual_seed_all", seed),
        }
        for attribute, value in patches.items():
            self.monkeypatch.setattr(torch.xpu, attribute, value)
        return self

    def _record(self, *call) -> None:
        self.calls.append(call)
        if call[0] == "set_device":
            self.initialised = True


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
    return SimulatedXpu(monkeypatch)


@pytest.fixture
def simulated_ipex(monkeypatch: pytest.MonkeyPatch, tmp_path):
    yield SimulatedIpex(monkeypatch, tmp_path)
    sys.modules.pop(ipex.MODULE, None)
