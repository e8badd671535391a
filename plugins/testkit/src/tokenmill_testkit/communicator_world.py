"""run_world: start one process per rank, wait for all of them with a deadline, read their reports.

The test process holds the TCP store the ranks meet at (bound to 127.0.0.1 on a port the system
chooses, so no other run can take it first); gloo then connects the ranks over loopback. A rank that
fails gets the others a short grace period and is then the whole run's failure; a run past its
deadline has every rank killed (each in its own process group), so a broken communicator fails the
tests instead of hanging them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GRACE_AFTER_FAILURE_S = 10.0  # how long the other ranks may still finish once one has failed
LOG_TAIL_LINES = 15


@dataclass(repr=False)
class RankRun:
    """One rank's process and what it left: its report (None if it wrote none) and log."""

    rank: int
    returncode: int | None
    report: dict[str, Any] | None
    log: str

    def __repr__(self) -> str:
        return f"RankRun(rank={self.rank}, returncode={self.returncode}, report={'yes' if self.report else 'none'})"

    def summary(self) -> str:
        """A few lines for a failure message: how the rank ended and where."""
        if self.report and self.report.get("error"):
            return f"rank {self.rank} raised:\n{self.report['error']}"
        tail = "\n".join(self.log.strip().splitlines()[-LOG_TAIL_LINES:])
        ended = "was killed (timeout or another rank failed)" if self.returncode is None \
            else f"exited with status {self.returncode}"
        return f"rank {self.rank} {ended}; the end of its log:\n{tail}"


def loopback_interface() -> str | None:
    """The loopback network interface's name ("lo" on Linux, "lo0" on macOS), for gloo."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((name for name in names if name.startswith("lo")), None)


def _child_environment() -> dict[str, str]:
    env = dict(os.environ)
    # the ranks import what this process imports, whatever put it on sys.path
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    interface = loopback_interface()
    if interface and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


def run_world(target: list[str], world_size: int, timeout_s: float, workdir: Path,
              op_timeout_s: float = 60.0) -> list[RankRun]:
    """Run ``communicator_worker`` once per rank with ``target`` (``--platform X`` or ``--factory Y``);
    every rank's RankRun, in rank order, once all have ended or been killed."""
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False)
    env = _child_environment()
    processes, logs = [], []
    try:
        for rank in range(world_size):
            log = open(workdir / f"rank{rank}.log", "w+b")  # noqa: SIM115 - closed below
            logs.append(log)
            command = [sys.executable, "-m", "tokenmill_testkit.communicator_worker", "--rank", str(rank),
                       "--world-size", str(world_size), "--store-port", str(store.port),
                       "--op-timeout", str(op_timeout_s), "--out", str(workdir), *target]
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
        killed = _wait(processes, time.monotonic() + timeout_s)
        runs = []
        for rank, (process, log) in enumerate(zip(processes, logs, strict=True)):
            log.seek(0)
            report_path = workdir / f"rank{rank}.pt"
            report = torch.load(report_path, weights_only=True) if report_path.exists() else None
            returncode = None if rank in killed else process.returncode
            runs.append(RankRun(rank, returncode, report, log.read().decode(errors="replace")))
        return runs
    finally:
        for process in processes:
            _kill(process)
        for log in logs:
            log.close()


def _wait(processes: list[subprocess.Popen], deadline: float) -> set[int]:
    """Until every process ended, or one failed and the grace ran out, or the deadline passed; then
    the ones still running are killed. The ranks killed."""
    while time.monotonic() < deadline:
        codes = [p.poll() for p in processes]
        if all(code is not None for code in codes):
            return set()
        if any(code not in (None, 0) for code in codes):
            deadline = min(deadline, time.monotonic() + GRACE_AFTER_FAILURE_S)
        time.sleep(0.05)
    killed = {rank for rank, process in enumerate(processes) if process.poll() is None}
    for rank in killed:
        _kill(processes[rank])
    return killed


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the rank's own session, started above
    except ProcessLookupError:
        pass
    process.wait()
