"""SimulatedDeviceModule: a torch device module (``torch.cuda``, ``torch.xpu``) patched to answer a
platform's queries for made-up GPUs, so probes and lifecycles are tested on machines without one.

``get_device_properties`` refuses to answer until ``set_device`` was called (``initialised``), as a
probe must not initialise the runtime; calls that change device state are recorded in ``calls``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch


class SimulatedDeviceModule:
    """Patches ``torch.<module_name>`` for the duration of a test (through ``monkeypatch``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module_name: str, runtime_label: str) -> None:
        self.monkeypatch = monkeypatch
        self.module = getattr(torch, module_name)
        self.runtime_label = runtime_label
        self.calls: list[tuple] = []
        self.initialised = False

    def simulate(self, count: int, properties: SimpleNamespace, free: int, total: int,
                 **answers: Callable[..., Any]) -> None:
        """``count`` devices, each with ``properties`` and ``free`` of ``total`` bytes; ``answers``
        patch further module functions (e.g. ``get_device_name``)."""

        def device_properties(index: int = 0) -> SimpleNamespace:
            if not self.initialised:
                raise AssertionError(f"get_device_properties initialises {self.runtime_label}; "
                                     "the probe must not call it")
            return properties

        patches = {
            "device_count": lambda: count,
            "is_initialized": lambda: self.initialised,
            "get_device_properties": device_properties,
            "mem_get_info": lambda index=None: (free, total),
            "set_device": lambda index: self._record("set_device", index),
            "synchronize": lambda index=None: self._record("synchronize", index),
            "manual_seed_all": lambda seed: self._record("manual_seed_all", seed),
            **answers,
        }
        for attribute, value in patches.items():
            self.monkeypatch.setattr(self.module, attribute, value)

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        if call[0] == "set_device":
            self.initialised = True
