"""OtherCpu: CPU time that processes outside a measurement spent while it ran — on a small shared machine
another job's work slows every server, so each run reports it beside its figures."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_by_process(proc: Path = Path("/proc")) -> dict[int, tuple[int, float]]:
    """pid -> (process group, CPU seconds used so far) of every process /proc shows (empty without /proc)."""
    found: dict[int, tuple[int, float]] = {}
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        found[int(entry.name)] = (int(fields[2]), (int(fields[11]) + int(fields[12])) / _TICKS)
    return found


class OtherCpu:
    """Started before a measurement; ``seconds()`` after it is the CPU time of processes outside
    ``exclude_groups`` (and outside this process) alive at the end. Processes that started and ended
    in between are not seen, which is why the load client, run in a group of its own, is not counted."""

    def __init__(self, exclude_groups: set[int], proc: Path = Path("/proc")):
        self.exclude_groups = set(exclude_groups)
        self.proc = proc
        self.before = cpu_by_process(proc)

    def seconds(self) -> float:
        """CPU seconds the other processes used since construction."""
        total = 0.0
        for pid, (group, cpu) in cpu_by_process(self.proc).items():
            if group in self.exclude_groups or pid == os.getpid():
                continue
            start = self.before.get(pid)
            total += cpu - start[1] if start else cpu
        return total
