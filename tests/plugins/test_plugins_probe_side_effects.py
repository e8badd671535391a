"""Every installed platform's probe is free of side effects: it changes neither ``sys.modules``
(no device runtime or vendor library imported) nor ``os.environ``. Loading the entry point may
import the plugin's own light module; torch, core's own dependency that every process using a
platform imports anyway, is imported before the snapshot."""

import importlib.metadata
import os
import sys

import pytest

from tokenmill.plugin_api import ENTRY_POINT_GROUPS, ProbeResult

PLATFORMS = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS["platform"]), key=lambda ep: ep.name)


@pytest.mark.parametrize("entry_point", PLATFORMS, ids=[ep.name for ep in PLATFORMS])
def test_probe_changes_neither_sys_modules_nor_environ(entry_point):
    import torch  # noqa: F401  (see the module docstring)

    platform = entry_point.load()
    modules, environ = set(sys.modules), dict(os.environ)
    result = platform.probe()
    added = sorted(set(sys.modules) - modules)
    removed = sorted(modules - set(sys.modules))
    assert not added and not removed, f"{entry_point.name}.probe() imported {added} / removed {removed}"
    changed = {k for k in set(environ) | set(os.environ) if environ.get(k) != os.environ.get(k)}
    assert not changed, f"{entry_point.name}.probe() changed environment variables {sorted(changed)}"
    assert isinstance(result, ProbeResult) and result.score >= 0
    assert result.available or result.reasons, f"{entry_point.name} scored 0 without saying why"
