"""ProcessGroup: one benchmark process (a server or a load client) in its own session, so that it
and everything it spawns (engine cores, worker processes) end together, even after its parent died.
Children that start sessions of their own (tokenmill's engine core does) are followed by parentage."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tokenmill_server.bench.proc_table import descendant_groups, read_proc_table


class ProcessGroup:
    """``command`` started in a new session (its pid is the group id) with stdout and stderr in ``log_path``.

    Use it as a context manager, or call ``stop()`` in a ``finally``: leaving the block ends the group
    and the groups its descendants made (as last seen while the leader ran)."""

    def __init__(self, command: list[str], log_path: str | Path, env: dict[str, str] | None = None):
        self.command = list(command)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.started = time.monotonic()
        try:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self._log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **(env or {})})
        except OSError:
            self._log.close()
            raise
        self._groups = {self.process.pid}

    @property
    def pid(self) -> int:
        """The leader's pid, which is also the group id."""
        return self.process.pid

    def elapsed(self) -> float:
        """Seconds since the process was spawned."""
        return time.monotonic() - self.started

    def returncode(self) -> int | None:
        """The leader's exit code, or None while it runs."""
        return self.process.poll()

    def wait(self, timeout: float) -> int:
        """The leader's exit code; past ``timeout`` seconds the group is ended and RuntimeError raised."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"{Path(self.command[0]).name} did not finish within {timeout:.0f} s: "
                               f"{self.log_tail()}") from None

    def groups(self) -> set[int]:
        """Process groups of the leader and its descendants; refreshed while the leader runs (once it is
        gone, orphans lose their parentage, so the groups seen before are kept)."""
        if self.process.poll() is None:
            self._groups |= descendant_groups(self.pid, read_proc_table()) - {os.getpgrp()}  # never our own
        return set(self._groups)

    def alive(self) -> bool:
        """Whether any process of the groups (the leader or anything it started) still runs; zombies do not count."""
        if self.process.poll() is None:
            return True
        groups = self.groups()
        return any(entry.pgid in groups and entry.state != "Z" for entry in read_proc_table().values())

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to every group, SIGKILL to whatever is left after ``grace`` seconds, then reap."""
        groups = self.groups()
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for group in groups:
                try:
                    os.killpg(group, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.1)
            if not self.alive():
                break
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:  # only if the leader is unkillable (uninterruptible sleep)
            pass
        if not self._log.closed:
            self._log.close()

    def log_tail(self, lines: int = 8, chars: int = 1500, ignore: tuple[str, ...] = ()) -> str:
        """The last lines of the log (less those starting with a prefix in ``ignore``), joined with `` | ``
        for one-line error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        kept = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(ignore)]
        kept = kept[-lines:]
        return " | ".join(kept)[-chars:] or "(empty log)"

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Within the block SIGTERM raises SystemExit, so ``finally`` clauses (which end process groups) run."""

    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
