"""Installing a plugin distribution into a fresh virtual environment makes it appear in
``tokenmill plugins``; uninstalling it makes it disappear. Nothing is downloaded: the new venv
sees the main environment's third-party packages (torch, stevedore, ...) through a .pth file
pointing at a folder of symlinks that leaves out every tokenmill distribution, so only what this
test installs is visible."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_CANDIDATES = ("plugins/examples/fake_device", "platforms/cpu")
TOKENMILL_ENTRY = re.compile(r"^(__editable__[._]+)?tokenmill", re.IGNORECASE)


def plugin_distribution() -> tuple[Path, str, list[str]]:
    """(folder, distribution name, platform entry point names) of the first plugin that exists."""
    for relative in PLUGIN_CANDIDATES:
        pyproject = ROOT / relative / "pyproject.toml"
        if pyproject.exists():
            project = tomllib.loads(pyproject.read_text())["project"]
            platforms = project.get("entry-points", {}).get("tokenmill.platforms", {})
            return pyproject.parent, project["name"], sorted(platforms)
    pytest.skip(f"none of {', '.join(PLUGIN_CANDIDATES)} has a pyproject.toml yet")


def shared_site_packages(tmp_path: Path) -> Path:
    """The main environment's site-packages without tokenmill's own distributions or .pth files."""
    shared = tmp_path / "shared-site"
    shared.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.suffix == ".pth" or TOKENMILL_ENTRY.match(entry.name):
            continue
        (shared / entry.name).symlink_to(entry)
    return shared


def copy_sources(folder: Path, tmp_path: Path) -> Path:
    """A clean copy to build from, so the build leaves no build/ or egg-info in the work tree."""
    target = tmp_path / "src" / folder.name
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    return target


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_install_then_uninstall_a_plugin_in_a_fresh_venv(tmp_path):
    folder, distribution, platforms = plugin_distribution()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENMILL_", "PYTHON", "VIRTUAL_ENV"))}
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env)
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env).stdout.strip())
    (site / "_main_environment.pth").write_text(f"{shared_site_packages(tmp_path)}\n")

    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    run([*pip, "install", "-q", "--no-build-isolation", "--no-deps", str(copy_sources(ROOT / "core", tmp_path)),
         str(copy_sources(folder, tmp_path))], env)
    listing = run([str(venv / "bin" / "tokenmill"), "plugins"], env).stdout
    assert distribution in listing
    for name in platforms:
        assert re.search(rf"^platform\s+{re.escape(name)}\b.*{re.escape(distribution)}", listing, re.MULTILINE), listing
    assert re.search(r"^platform\s+reference\b.*\btokenmill\b", listing, re.MULTILINE)
    assert "tokenmill-cuda" not in listing  # the main environment's plugins stay invisible

    run([*pip, "uninstall", "-y", "-q", distribution], env)
    listing = run([str(venv / "bin" / "tokenmill"), "plugins"], env).stdout
    assert distribution not in listing
    assert "* would be chosen: platform" in listing
