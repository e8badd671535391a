"""Choosing the platform: a pin, else the highest probe score, and never a silent fall back.

Rules, in order:

1. A broken platform plugin (it failed to import or probe, or was built for another plugin API)
   is an error carrying its traceback, unless ``allow_cpu_fallback`` is set, which turns it into a
   warning and carries on with what works. A broken plugin the user did not pin is also only a
   warning when a pin is given.
2. A pin (``--device`` or ``TOKENMILL_DEVICE``) is ``NAME[:INDEX]``. ``NAME`` first matches platform
   plugin names exactly (blocked plugins aside); only when no plugin has that name does it match
   device types, and then the best platform of that device type is taken. So ``--device cuda`` is
   the cuda plugin (never ROCm, whose torch device type is also "cuda"), ``--device reference`` is
   the reference platform, and ``--device cpu`` is the optimised ``cpu`` plugin when installed,
   else the best platform with device type "cpu" (the reference one). A pin that matches nothing
   usable is an error with every match's probe reasons.
3. Among the candidates the highest probe score wins, then the higher ``Platform.priority``; a tie
   left after that is an error listing the tied platforms and their scores.
4. ``INDEX`` must be one of the devices the probe found (index 0 when it lists none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tokenmill.discovery.record import BROKEN, PluginRecord, PluginStatus
from tokenmill.discovery.registry import PluginRegistry
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import Platform

DEVICE_ENV_VAR = "TOKENMILL_DEVICE"


@dataclass
class PlatformChoice:
    """The chosen platform class and device index, with every platform record considered."""

    record: PluginRecord
    device_index: int
    pin: str | None
    candidates: list[PluginRecord]
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def platform_cls(self) -> type[Platform]:
        return self.record.obj

    @property
    def score(self) -> int:
        return self.record.probe.score if self.record.probe else 0

    def instantiate(self) -> Platform:
        """A platform instance for the chosen device (not yet activated)."""
        return self.platform_cls(self.device_index)


def parse_pin(pin: str) -> tuple[str, int | None]:
    """'cuda:1' -> ('cuda', 1); 'cpu' -> ('cpu', None). Raises SelectionError when malformed."""
    name, _, index = pin.strip().partition(":")
    if not name:
        raise SelectionError(f"--device '{pin}' names no platform; expected NAME or NAME:INDEX, e.g. cuda:1")
    if not index:
        return name.lower(), None
    if not index.isdigit():
        raise SelectionError(f"--device '{pin}' has device index '{index}'; expected a non-negative integer")
    return name.lower(), int(index)


def _named(record: PluginRecord, name: str) -> bool:
    return name in (record.name.lower(), record.entry_name.lower())


def _pinned(records: list[PluginRecord], name: str, skip_broken: bool) -> list[PluginRecord]:
    """The records a pin NAME refers to: plugins called NAME, else platforms of device type NAME."""
    skipped = (PluginStatus.BLOCKED, *BROKEN) if skip_broken else (PluginStatus.BLOCKED,)
    by_name = [r for r in records if _named(r, name) and r.status not in skipped]
    return by_name or [r for r in records if (r.device_type or "").lower() == name]


def _broken_message(record: PluginRecord) -> str:
    head = f"platform plugin '{record.name}' ({record.source}) is {record.status.value}: {record.reason}"
    return f"{head}\n{record.traceback.rstrip()}" if record.traceback else head


def _describe(record: PluginRecord) -> str:
    if record.probe is not None:
        return f"{record.name} ({record.source}): score {record.probe.score}: {'; '.join(record.probe.reasons) or '-'}"
    return f"{record.name} ({record.source}): {record.status.value}: {'; '.join(record.reasons) or '-'}"


def _rank(records: list[PluginRecord]) -> list[PluginRecord]:
    return sorted(records, key=lambda r: (-r.probe.score, -getattr(r.obj, "priority", 0), r.name))


def select_platform(registry: PluginRegistry, device: str | None = None,
                    allow_cpu_fallback: bool = False) -> PlatformChoice:
    """Choose the platform; ``device`` defaults to ``TOKENMILL_DEVICE``. See the module docstring."""
    pin = device if device is not None else (os.environ.get(DEVICE_ENV_VAR) or None)
    records = registry.records("platform")
    name, index = parse_pin(pin) if pin else (None, None)
    candidates = records if name is None else _pinned(records, name, allow_cpu_fallback)

    warnings, errors = [], []
    for record in records:
        if record.status not in BROKEN:
            continue
        if name is not None and record not in candidates and not _named(record, name):
            warnings.append(f"{_broken_message(record)}\n(not used: --device {pin} pins another platform)")
        elif allow_cpu_fallback:
            warnings.append(f"{_broken_message(record)}\n(continuing without it: --allow-cpu-fallback)")
        else:
            errors.append(_broken_message(record))
    if errors:
        hint = ("fix or uninstall the plugin, block it with TOKENMILL_PLUGINS=-NAME, or pass --allow-cpu-fallback "
                "to continue without it")
        raise SelectionError("\n\n".join(errors) + f"\n\n{hint}")
    warnings += registry.warnings

    usable = [r for r in candidates if r.available]
    if not usable:
        if name is None:
            raise SelectionError("no platform can run here:\n  " + "\n  ".join(_describe(r) for r in records))
        if not candidates:
            installed = ", ".join(sorted({r.name for r in records} | {r.device_type for r in records if r.device_type}))
            raise SelectionError(f"--device {pin}: no installed platform is called '{name}' or has device type "
                                 f"'{name}' (installed: {installed or 'none'})")
        others = sorted({r.name for r in records if r.available and r.device_type == candidates[0].device_type})
        hint = f"\n(other platforms for device type {candidates[0].device_type}: {', '.join(others)})" if others else ""
        raise SelectionError(f"--device {pin}: no matching platform can run here:\n  "
                             + "\n  ".join(_describe(r) for r in candidates) + hint)

    ranked = _rank(usable)
    best = ranked[0]
    tied = [r for r in ranked if (r.probe.score, getattr(r.obj, "priority", 0))
            == (best.probe.score, getattr(best.obj, "priority", 0))]
    if len(tied) > 1:
        listed = "\n  ".join(_describe(r) for r in tied)
        choices = " or ".join(f"--device {r.name}" for r in tied)
        raise SelectionError(f"platforms tie for first place:\n  {listed}\nchoose one with {choices} "
                             f"(or set {DEVICE_ENV_VAR})")
    return PlatformChoice(best, _device_index(best, index, pin), pin, list(records), warnings)


def _device_index(record: PluginRecord, index: int | None, pin: str | None) -> int:
    devices = record.probe.devices
    if index is None:
        return devices[0].index if devices else 0
    known = [d.index for d in devices] or [0]
    if index not in known:
        found = ", ".join(f"{d.index}: {d.name}" for d in devices) or "device 0 only"
        raise SelectionError(f"--device {pin}: platform '{record.name}' has no device {index} "
                             f"(its probe found {found})")
    return index
