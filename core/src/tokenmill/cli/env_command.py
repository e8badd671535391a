"""``tokenmill env``: versions, environment variables and every platform probe, for bug reports."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform as host
import sys
from typing import Any

from tokenmill.discovery import DEVICE_ENV_VAR, PluginRegistry
from tokenmill.discovery.policy import ENV_VAR as PLUGINS_ENV_VAR
from tokenmill.plugin_api import PLUGIN_API_VERSION, hookimpl

PACKAGES = ("tokenmill", "torch", "triton", "transformers", "pluggy", "stevedore")


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``env``."""
    parser = subparsers.add_parser("env", help="show versions, settings and platform probes (for bug reports)")
    parser.set_defaults(func=run)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment_report(registry: PluginRegistry) -> str:
    """The text of ``tokenmill env``. Reads versions from package metadata, so nothing is imported
    beyond what the platform probes themselves need."""
    lines = [f"python: {sys.version.split()[0]} ({sys.executable})",
             f"os: {host.system()} {host.release()} ({host.machine()})",
             f"plugin API: {'.'.join(map(str, PLUGIN_API_VERSION))}"]
    lines += [f"{package}: {_version(package)}" for package in PACKAGES]
    for variable in (DEVICE_ENV_VAR, PLUGINS_ENV_VAR):
        lines.append(f"{variable}: {os.environ.get(variable, '(unset)')}")
    lines.append("platform probes:")
    for record in registry.records("platform"):
        if record.probe is None:
            lines.append(f"  {record.name}: {record.status.value}: {record.reason or '-'}")
            continue
        lines.append(f"  {record.name} ({record.source}): score {record.probe.score}")
        lines += [f"      {reason}" for reason in record.probe.reasons]
        for device in record.probe.devices:
            memory = f", {device.total_memory / 2**30:.1f} GiB" if device.total_memory else ""
            lines.append(f"      device {device.index}: {device.name}{memory}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the environment report."""
    print(environment_report(args.registry))
    return 0
