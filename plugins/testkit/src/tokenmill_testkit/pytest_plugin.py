"""The testkit's pytest plugin (entry point ``pytest11``): ``--tokenmill-device``, the ``live`` marker and a
plugin header line.

The header lists the installed tokenmill plugins. Loaded by every pytest run in an environment
that has the testkit, so it imports nothing heavy."""

from __future__ import annotations

from importlib import metadata

import pytest

GROUPS = ("tokenmill.platforms", "tokenmill.attention_backends", "tokenmill.quantizers", "tokenmill.plugins")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tokenmill", "tokenmill plugin conformance")
    group.addoption(
        "--tokenmill-device",
        dest="tokenmill_device",
        default=None,
        metavar="DEVICE",
        help="run the attention and quantizer conformance suites on this torch device (e.g. cuda:0) "
        "instead of each suite's `device` attribute",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Registers ``live``, the marker of suites that start processes (the communicator conformance),
    so a plugin's own ``--strict-markers`` run accepts it."""
    config.addinivalue_line("markers", "live: starts another Python process (the communicator conformance's ranks)")


def pytest_report_header(config: pytest.Config) -> str:
    """``tokenmill plugins: cpu (tokenmill-cpu 0.1.0), ...``, read from metadata (nothing imported)."""
    from tokenmill.plugin_api import PLUGIN_API_VERSION

    seen = []
    for group in GROUPS:
        for entry_point in metadata.entry_points(group=group):
            dist = entry_point.dist
            source = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
            seen.append(f"{group.rsplit('.', 1)[1]}:{entry_point.name} ({source})")
    api = ".".join(map(str, PLUGIN_API_VERSION))
    return f"tokenmill plugin API {api}; plugins: {', '.join(seen) or 'none'}"
