"""OtherCpu: CPU time that processes outside a measurement spent while it ran — on a small shared machine
another job's work slows every server, so each run reports it beside its figures."""

from __future__ import annotations

import os
from pathlib import Path

from tokenmill_server.bench.proc_table import PROC, read_proc_table


class OtherCpu:
    """Started before a measurement; ``seconds(groups)`` after it is the CPU time of processes outside
    ``groups`` (and outside this process) alive at the end. Processes that started and ended in between
    are not seen, which is why the load client, run in a group of its own, is not counted."""

    def __init__(self, proc: Path = PROC):
        self.proc = proc
        self.before = read_proc_table(proc)

    def seconds(self, exclude_groups: set[int]) -> float:
        """CPU seconds the processes outside ``exclude_groups`` used since construction."""
        total = 0.0
        for pid, entry in read_proc_table(self.proc).items():
            if entry.pgid in exclude_groups or pid == os.getpid():
                continue
            start = self.before.get(pid)
            total += entry.cpu_s - start.cpu_s if start else entry.cpu_s
        return total
