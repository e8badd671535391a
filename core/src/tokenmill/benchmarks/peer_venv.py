"""PeerVenv: the separate virtual environment (``.bench-venv``, made by ``make bench-peers``) that holds
the peer engines, which of them it can import, and how to run a peer script under its Python."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

PEERS_DIR = os.path.join(os.path.dirname(__file__), "peers")


@dataclass(frozen=True)
class PeerVenv:
    """A virtual environment at ``path`` holding peers (vllm, llama_cpp) apart from tokenmill's own."""

    path: str = ".bench-venv"

    @property
    def python(self) -> str:
        """The venv's Python interpreter."""
        return os.path.join(self.path, "bin", "python")

    def missing(self, module: str) -> str | None:
        """None when ``module`` imports in this venv; else the exact reason, for the benchmark report."""
        if not os.path.exists(self.python):
            return f"{self.path} does not exist: run `make bench-peers`"
        check = subprocess.run([self.python, "-c", f"import importlib.util,sys; sys.exit(importlib.util.find_spec({module!r}) is None)"],
                               capture_output=True, text=True)
        if check.returncode == 1:
            return f"{module} is not installed in {self.path}"
        if check.returncode != 0:
            return f"{self.python} failed (exit code {check.returncode}): {check.stderr.strip()[-500:]}"
        return None

    def version(self, distribution: str) -> str | None:
        """The installed version of ``distribution`` in this venv, or None when it is not installed."""
        check = subprocess.run([self.python, "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                               capture_output=True, text=True)
        if check.returncode != 0:
            return None
        return check.stdout.strip() or None

    def script_command(self, script: str, *args: str) -> list[str]:
        """The command that runs the standalone peer script ``script`` (a file in ``peers/``) here."""
        return [self.python, os.path.join(PEERS_DIR, script), *args]
