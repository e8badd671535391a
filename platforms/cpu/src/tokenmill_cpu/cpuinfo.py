"""The host CPU as described by ``/proc/cpuinfo``: model, feature flags and core topology."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CpuInfo:
    """What the kernel reports about the CPUs. Empty where the file does not exist (macOS)."""

    model_name: str = ""
    flags: frozenset[str] = frozenset()
    core_of: Mapping[int, tuple[str, str]] = field(default_factory=dict)  # logical cpu -> (socket, core)

    def physical_cores(self, cpus: Iterable[int]) -> int:
        """How many distinct physical cores the logical ``cpus`` sit on (SMT siblings count once).
        A CPU without topology data counts as its own core."""
        return max(1, len({self.core_of.get(cpu, ("cpu", str(cpu))) for cpu in cpus}))


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the text of ``/proc/cpuinfo`` (x86 ``flags`` or Arm ``Features`` lines)."""
    model_name = ""
    flags: set[str] = set()
    core_of: dict[int, tuple[str, str]] = {}
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        model_name = model_name or fields.get("model name", "")
        flags.update((fields.get("flags") or fields.get("Features") or "").split())
        if "processor" in fields and "core id" in fields and fields["processor"].isdigit():
            core_of[int(fields["processor"])] = (fields.get("physical id", "0"), fields["core id"])
    return CpuInfo(model_name=model_name, flags=frozenset(flags), core_of=core_of)


def read_cpuinfo(path: str = "/proc/cpuinfo") -> CpuInfo:
    """Read and parse ``path``; an empty ``CpuInfo`` when it does not exist."""
    try:
        with open(path) as f:
            return parse_cpuinfo(f.read())
    except FileNotFoundError:
        return CpuInfo()
