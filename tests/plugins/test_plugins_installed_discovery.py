"""Discovery over the plugins actually installed in this environment: every entry point of every
kind is accounted for, none of them is broken, and the CLI lists each distribution."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from tokenmill.discovery import (
    KINDS,
    PluginPolicy,
    PluginRegistry,
    PluginStatus,
    select_attention_backend,
    select_platform,
)
from tokenmill.plugin_api import ENTRY_POINT_GROUPS


def installed():
    return PluginRegistry.from_installed(PluginPolicy())


def test_every_installed_entry_point_has_a_record():
    registry = installed()
    for kind in KINDS:
        expected = {(ep.name, ep.value) for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[kind])}
        assert {(r.entry_name, r.entry_point) for r in registry.records(kind)} == expected


def test_no_installed_plugin_is_broken():
    broken = [f"{r.kind} '{r.name}' ({r.source}): {r.status.value}: {r.reason}\n{r.traceback or ''}"
              for r in installed().all_records() if r.status in (PluginStatus.FAILED, PluginStatus.INCOMPATIBLE)]
    assert not broken, "broken plugins:\n" + "\n".join(broken)


def test_a_platform_is_chosen_and_the_reference_entries_are_available():
    registry = installed()
    assert select_platform(registry, allow_cpu_fallback=True).record.available
    core = {(r.kind, r.name) for r in registry.all_records() if r.is_core and r.available}
    assert {("platform", "reference"), ("attention_backend", "reference"), ("quantizer", "unquantized")} <= core


def test_tokenmill_plugins_lists_every_installed_distribution():
    script = Path(sys.executable).with_name("tokenmill")
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENMILL_PLUGINS", "TOKENMILL_DEVICE")}
    result = subprocess.run([str(script), "plugins", "--allow-cpu-fallback"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    distributions = {ep.dist.name for kind in KINDS for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[kind])}
    missing = [d for d in distributions if d not in result.stdout]
    assert not missing, f"not listed: {missing}\n{result.stdout}"


def test_selection_picks_the_fake_device_only_when_enabled(monkeypatch):
    """The example plugin's tutorial claim, through core's real discovery of the installed entry points."""
    from tokenmill_fake_device.platform import ENV_VAR
    from tokenmill_testkit import AttentionCase

    monkeypatch.setenv(ENV_VAR, "1")
    registry = PluginRegistry.from_installed()
    choice = select_platform(registry)
    assert choice.name == "fakedev"
    platform = choice.instantiate()
    platform.activate()
    backend = select_attention_backend(registry, platform, AttentionCase(4, 2, 64).spec("float32"))
    assert backend.name == "fakedev"
    monkeypatch.setenv(ENV_VAR, "0")
    assert select_platform(PluginRegistry.from_installed()).name != "fakedev"
