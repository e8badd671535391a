"""The whole repository passes ruff with the rules in pyproject.toml (imports sorted, no unused or
undefined names, PEP 604 annotations, bugbear's checks)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff() -> list[str]:
    """The ruff command of this environment (installed from requirements-dev.txt)."""
    beside = Path(sys.executable).with_name("ruff")
    return [str(beside)] if beside.exists() else [shutil.which("ruff") or "ruff"]


def test_ruff_finds_nothing():
    result = subprocess.run([*ruff(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-1000:]
