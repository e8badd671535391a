"""Intel Extension for PyTorch (IPEX) as an optional extra, never a requirement.

IPEX is end-of-life: its last release (2.8) is built for torch 2.8 and exits the interpreter when
imported under any other torch. So it is imported only when its installed version has the running
torch's major.minor, and even then no exception -- nor ``SystemExit`` -- may escape the import.
Everything else in this module reads package metadata only.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

DISTRIBUTION = "intel-extension-for-pytorch"
MODULE = "intel_extension_for_pytorch"


def installed_version() -> str | None:
    """The installed IPEX version according to package metadata, without importing it."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def major_minor(version: str) -> tuple[int, int] | None:
    """``"2.8.10+xpu"`` -> ``(2, 8)``; None when the string does not start with two numbers."""
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def matches_torch(ipex_version: str, torch_version: str) -> bool:
    """IPEX releases are built for exactly one torch major.minor."""
    ipex = major_minor(ipex_version)
    return ipex is not None and ipex == major_minor(torch_version)


def status(torch_version: str) -> str | None:
    """One line about IPEX for probe reports, or None when it is not installed."""
    version = installed_version()
    if version is None:
        return None
    if matches_torch(version, torch_version):
        return f"{DISTRIBUTION} {version} matches torch {torch_version}: used as an optional accelerator"
    return f"{DISTRIBUTION} {version} ignored: it is built for another torch than {torch_version}"


def load(torch_version: str) -> tuple[ModuleType | None, str | None]:
    """Import IPEX when a matching version is installed. Returns (module or None, note for logs)."""
    version = installed_version()
    if version is None:
        return None, None
    if not matches_torch(version, torch_version):
        return None, status(torch_version)
    try:
        return importlib.import_module(MODULE), f"{DISTRIBUTION} {version} loaded"
    except (Exception, SystemExit) as error:  # IPEX calls sys.exit() on a torch mismatch
        return None, f"{DISTRIBUTION} {version} failed to import ({error!r}); using stock torch.xpu"
