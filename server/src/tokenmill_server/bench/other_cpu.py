"""OtherCpu: CPU time that processes outside a measurement spent while it ran — on a small shared machine
another job's work slows every server, so each run reports it beside its figures."""

from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path

from tokenmill_server.bench.proc_table import PROC, TICKS, read_proc_table

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal of /proc/stat's "cpu" line


def machine_busy_seconds(proc: Path = PROC) -> float | None:
    """CPU seconds every CPU of the machine has spent busy since boot (None without /proc/stat)."""
    try:
        fields = (proc / "stat").read_text().splitlines()[0].split()[1:]
        return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / TICKS
    except (OSError, IndexError, ValueError):
        return None


def _own_and_reaped_children() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class OtherCpu:
    """Started before a measurement; ``seconds(groups)`` after it is the machine's busy CPU time less that
    of the measured server (``groups``), of this process and of its children it has reaped (the load client)
    — what every other process, including ones that came and went meanwhile, spent."""

    def __init__(self, proc: Path = PROC, ours: Callable[[], float] | None = None):
        self.proc = proc
        self._ours = ours or _own_and_reaped_children
        self.busy = machine_busy_seconds(proc)
        self.before = read_proc_table(proc)
        self.ours = self._ours()

    def seconds(self, exclude_groups: set[int]) -> float | None:
        """CPU seconds the processes outside ``exclude_groups`` used since construction (None without /proc)."""
        busy = machine_busy_seconds(self.proc)
        if busy is None or self.busy is None:
            return None
        measured = 0.0
        for pid, entry in read_proc_table(self.proc).items():
            if entry.pgid in exclude_groups:
                start = self.before.get(pid)
                measured += entry.cpu_s - start.cpu_s if start else entry.cpu_s
        ours = self._ours() - self.ours
        return max(0.0, busy - self.busy - measured - ours)
