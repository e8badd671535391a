"""The process table as /proc shows it: each process's parent, process group, state and CPU time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ProcEntry(NamedTuple):
    """One process: parent pid, process group, state letter (``Z`` for a zombie), user+system CPU seconds."""

    ppid: int
    pgid: int
    state: str
    cpu_s: float


def read_proc_table(proc: Path = PROC) -> dict[int, ProcEntry]:
    """pid -> ProcEntry for every process (empty where there is no /proc)."""
    table: dict[int, ProcEntry] = {}
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # the name may hold ") "
            table[int(entry.name)] = ProcEntry(int(fields[1]), int(fields[2]), fields[0],
                                               (int(fields[11]) + int(fields[12])) / TICKS)
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
    return table


def descendant_groups(pid: int, table: dict[int, ProcEntry]) -> set[int]:
    """The process groups of ``pid`` and of every process below it (children may start sessions of their own)."""
    children: dict[int, list[int]] = {}
    for child, entry in table.items():
        children.setdefault(entry.ppid, []).append(child)
    groups, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current in table:
            groups.add(table[current].pgid)
        todo.extend(children.get(current, []))
    return groups
