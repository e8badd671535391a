"""ProcessGroup: one benchmark process (a server or a load client) in its own session, so that it
and everything it spawns (engine cores, worker processes) end together, even after its parent died."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ProcessGroup:
    """``command`` started in a new session (its pid is the group id) with stdout and stderr in ``log_path``.

    Use it as a context manager, or call ``stop()`` in a ``finally``: leaving the block ends the group."""

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

    def alive(self) -> bool:
        """Whether any process of the group (the leader or anything it started) still runs; zombies do not count."""
        if self.process.poll() is None:
            return True
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _has_members(self.pid)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the whole group, SIGKILL to whatever is left after ``grace`` seconds, then reap."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
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


def _has_members(pgid: int) -> bool:
    """Whether a process that is not a zombie is in group ``pgid`` (read from /proc)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True  # no /proc to look into: killpg(0) already said the group exists
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
