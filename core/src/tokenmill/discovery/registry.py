"""PluginRegistry: every installed plugin by kind, loaded lazily one kind at a time.

``discover()`` builds (and caches) the registry of the installed entry points; tests build one from
in-memory objects with ``PluginRegistry.make_test_instance`` (like stevedore's), so selection can
be exercised without installing anything. Listing entry points imports nothing; a kind's plugins
are imported, checked and probed the first time that kind is asked for.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from typing import Any

from tokenmill.discovery.loader import load_records
from tokenmill.discovery.policy import ENV_VAR, PluginPolicy
from tokenmill.discovery.record import CORE_DISTRIBUTION, KINDS, PluginRecord, PluginStatus
from tokenmill.plugin_api import ENTRY_POINT_GROUPS

TEST_DISTRIBUTION = "in-memory-test"


@dataclass
class _KindSource:
    """Where one kind's plugins come from: entry points (imported on load) and ready objects."""

    entry_points: list[EntryPoint] = field(default_factory=list)
    objects: list[tuple[str, Any]] = field(default_factory=list)


def installed_entry_points(kind: str) -> list[EntryPoint]:
    """The installed entry points of one kind, each knowing its distribution; nothing imported."""
    seen, result = set(), []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[kind]):
        dist = getattr(ep, "dist", None)
        key = (ep.name, ep.value, dist.name if dist is not None else None)
        if key not in seen:  # the same distribution can be visible twice on sys.path
            seen.add(key)
            result.append(ep)
    return sorted(result, key=lambda ep: (ep.name, ep.value))


class PluginRegistry:
    """Discovered plugins by kind ("platform", "attention_backend", "quantizer", "plugin")."""

    def __init__(self, sources: Mapping[str, _KindSource], policy: PluginPolicy | None = None,
                 object_distribution: str | None = None) -> None:
        unknown = set(sources) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown plugin kinds {sorted(unknown)}; expected {', '.join(KINDS)}")
        self._sources = {kind: sources.get(kind, _KindSource()) for kind in KINDS}
        self.policy = policy or PluginPolicy()
        self._object_distribution = object_distribution
        self._records: dict[str, list[PluginRecord]] = {}

    @classmethod
    def from_installed(cls, policy: PluginPolicy | None = None) -> PluginRegistry:
        """A registry of the entry points installed in this environment."""
        sources = {kind: _KindSource(entry_points=installed_entry_points(kind)) for kind in KINDS}
        return cls(sources, policy if policy is not None else PluginPolicy.from_env())

    @classmethod
    def make_test_instance(cls, *, platforms: Iterable[Any] = (), attention_backends: Iterable[Any] = (),
                           quantizers: Iterable[Any] = (), plugins: Mapping[str, Any] | Iterable[Any] = (),
                           policy: PluginPolicy | str | None = None, include_core: bool = True,
                           distribution: str = TEST_DISTRIBUTION) -> PluginRegistry:
        """A registry of in-memory plugins. Items are plugin classes (named by their ``name``) or
        ``importlib.metadata.EntryPoint`` objects (imported through the real loading path, e.g. to
        test a plugin that fails to import); ``plugins`` maps names to pluggy plugin objects.
        ``include_core`` adds core's own installed reference entries; ``policy`` may be a
        ``TOKENMILL_PLUGINS``-style string."""
        if isinstance(policy, str):
            policy = PluginPolicy.parse(policy)
        if isinstance(plugins, Mapping):
            plugins = list(plugins.items())
        given = {"platform": platforms, "attention_backend": attention_backends, "quantizer": quantizers,
                 "plugin": plugins}
        sources = {}
        for kind, items in given.items():
            source = _KindSource()
            if include_core:
                source.entry_points = [ep for ep in installed_entry_points(kind)
                                       if ep.dist is not None and ep.dist.name == CORE_DISTRIBUTION]
            for item in items:
                if isinstance(item, EntryPoint):
                    source.entry_points.append(item)
                elif isinstance(item, tuple):
                    source.objects.append(item)
                else:
                    source.objects.append((getattr(item, "name", getattr(item, "__name__", repr(item))), item))
            sources[kind] = source
        return cls(sources, policy, object_distribution=distribution)

    def records(self, kind: str) -> list[PluginRecord]:
        """Every plugin of ``kind`` with its status; loads (and probes) that kind on first use."""
        if kind not in self._sources:
            raise ValueError(f"unknown plugin kind {kind!r}; expected one of {', '.join(KINDS)}")
        if kind not in self._records:
            source = self._sources[kind]
            self._records[kind] = load_records(kind, source.entry_points, source.objects, self.policy,
                                               self._object_distribution)
        return self._records[kind]

    def all_records(self) -> list[PluginRecord]:
        """Every plugin of every kind, in kind order."""
        return [record for kind in KINDS for record in self.records(kind)]

    def available(self, kind: str) -> list[PluginRecord]:
        """The plugins of ``kind`` that can take part in selection."""
        return [r for r in self.records(kind) if r.status is PluginStatus.AVAILABLE]

    def find(self, kind: str, name: str) -> list[PluginRecord]:
        """Records of ``kind`` whose name (or entry point name) is ``name``, any status."""
        return [r for r in self.records(kind) if name in (r.name, r.entry_name)]

    def names(self, kind: str) -> list[str]:
        """Names of the loaded-or-not plugins of ``kind``, sorted."""
        return sorted({r.name for r in self.records(kind)})

    @property
    def warnings(self) -> list[str]:
        """Problems with ``TOKENMILL_PLUGINS`` itself (tokens matching nothing); needs no import."""
        if not self.policy.restricts:
            return []
        entries: list[tuple[str, str | None, bool]] = []
        for source in self._sources.values():
            for ep in source.entry_points:
                dist = getattr(ep, "dist", None)
                name = dist.name if dist is not None else None
                entries.append((ep.name, name, name == CORE_DISTRIBUTION))
            entries += [(name, self._object_distribution, self._object_distribution == CORE_DISTRIBUTION)
                        for name, _ in source.objects]
        return self.policy.warnings_for(entries)


_installed: dict[str | None, PluginRegistry] = {}


def discover(refresh: bool = False) -> PluginRegistry:
    """The registry of installed plugins under the current ``TOKENMILL_PLUGINS`` policy, cached
    per policy string for the life of the process; ``refresh=True`` rescans the entry points."""
    key = os.environ.get(ENV_VAR)
    if refresh or key not in _installed:
        _installed[key] = PluginRegistry.from_installed(PluginPolicy.parse(key))
    return _installed[key]

