"""Loading one plugin kind: stevedore imports the entry points, then each object is checked
(type, required attributes, the API version it declares itself) and asked whether it can run here (platform probe,
attention-backend availability, pluggy hook validation). Nothing raises out of here: every outcome
becomes a ``PluginRecord`` status with reasons."""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Iterable
from importlib.metadata import EntryPoint
from typing import Any

import pluggy
from stevedore import ExtensionManager

from tokenmill.discovery.policy import PluginPolicy
from tokenmill.discovery.record import PluginRecord, PluginStatus
from tokenmill.plugin_api import (
    ENTRY_POINT_GROUPS,
    PLUGIN_API_VERSION,
    PROJECT_NAME,
    AttentionBackend,
    Platform,
    ProbeResult,
    Quantizer,
    api_version_problem,
    declared_api_version,
    hookspecs,
    is_compatible,
)
from tokenmill.plugin_api.version import is_well_formed

BASE_CLASSES: dict[str, type] = {"platform": Platform, "attention_backend": AttentionBackend, "quantizer": Quantizer}
REQUIRED_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "platform": ("name", "device_type"),
    "attention_backend": ("name",),
    "quantizer": ("name",),
}
IN_MEMORY = "<in-memory>"


class _EntryPointManager(ExtensionManager):
    """stevedore's ExtensionManager over an explicit list of entry points: ours come from
    ``importlib.metadata`` (so they know their distribution) and were already filtered by the
    allow/deny policy, so blocked plugins are never imported."""

    def __init__(self, namespace: str, entry_points: list[EntryPoint], on_load_failure_callback: Any) -> None:
        self._entry_points = entry_points
        super().__init__(namespace, invoke_on_load=False, on_load_failure_callback=on_load_failure_callback)

    def list_entry_points(self) -> list[EntryPoint]:
        """The entry points this manager was given."""
        return self._entry_points


def _distribution(ep: EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    return dist.name, dist.version


def _format_exception(error: BaseException) -> str:
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


def api_mismatch_line(record: PluginRecord, version: tuple[int, int]) -> str:
    """The one line that explains why a plugin built for another API is refused."""
    core = f"{PLUGIN_API_VERSION[0]}.{PLUGIN_API_VERSION[1]}"
    who = f"{record.kind.replace('_', ' ')} plugin '{record.name}' ({record.source})"
    if version[0] != PLUGIN_API_VERSION[0]:
        fix = f"install a release of {record.distribution or record.name} built for plugin API {PLUGIN_API_VERSION[0]}.x"
        return f"{who} was built for plugin API {version[0]}.{version[1]}, but this tokenmill provides {core}: {fix}"
    return f"{who} needs plugin API {version[0]}.{version[1]}, but this tokenmill provides {core}: upgrade tokenmill"


def load_records(kind: str, entry_points: Iterable[EntryPoint], objects: Iterable[tuple[str, Any]],
                 policy: PluginPolicy, object_distribution: str | None = None) -> list[PluginRecord]:
    """Load and check every entry point and in-memory object of one kind."""
    records: list[PluginRecord] = []
    to_load: list[EntryPoint] = []
    by_target: dict[tuple[str, str], PluginRecord] = {}
    for ep in entry_points:
        distribution, version = _distribution(ep)
        record = PluginRecord(kind, ep.name, ep.value, distribution, version)
        records.append(record)
        blocked = policy.blocked_reason(ep.name, distribution, record.is_core)
        if blocked:
            record.mark(PluginStatus.BLOCKED, blocked)
            continue
        to_load.append(ep)
        by_target[(ep.name, ep.value)] = record

    def on_failure(_manager: Any, ep: EntryPoint, error: Exception) -> None:
        by_target[(ep.name, ep.value)].mark(
            PluginStatus.FAILED, f"import failed: {type(error).__name__}: {error}", traceback=_format_exception(error))

    if to_load:
        manager = _EntryPointManager(ENTRY_POINT_GROUPS[kind], to_load, on_failure)
        for extension in manager.extensions:
            by_target[(extension.entry_point.name, extension.entry_point.value)].obj = extension.plugin

    for name, obj in objects:
        record = PluginRecord(kind, name, IN_MEMORY, object_distribution, None, obj=obj)
        records.append(record)
        blocked = policy.blocked_reason(name, object_distribution, record.is_core)
        if blocked:
            record.obj = None
            record.mark(PluginStatus.BLOCKED, blocked)

    for record in records:
        if record.available:
            _check(record)
    _refuse_duplicates(records)
    return records


def _check(record: PluginRecord) -> None:
    """Validate a loaded object, then ask it whether it can run here."""
    problem = _shape_problem(record)
    if problem:
        record.mark(PluginStatus.FAILED, problem)
        return
    if record.kind != "plugin":
        record.name = record.obj.name
    version, problem = declared_api_version(record.obj), api_version_problem(record.obj)
    if problem and not is_well_formed(version):  # undeclared (inherited values do not count) or malformed
        record.mark(PluginStatus.FAILED, problem)
        return
    record.api_version = version
    if not is_compatible(version):
        record.mark(PluginStatus.INCOMPATIBLE, api_mismatch_line(record, version))
        return
    try:
        _probe(record)
    except Exception as error:  # a broken plugin must surface, never silently vanish
        stage = {"platform": "probe()", "attention_backend": "availability()", "plugin": "hook validation"}
        record.mark(PluginStatus.FAILED, f"{stage.get(record.kind, 'check')} raised {type(error).__name__}: {error}",
                    traceback=_format_exception(error))


def _shape_problem(record: PluginRecord) -> str | None:
    obj = record.obj
    if record.kind == "plugin":
        return None
    base = BASE_CLASSES[record.kind]
    if not (inspect.isclass(obj) and issubclass(obj, base)):
        return f"entry point {record.entry_point} names {obj!r}, which is not a {base.__name__} subclass"
    missing = [a for a in REQUIRED_ATTRIBUTES[record.kind] if not isinstance(getattr(obj, a, None), str)]
    if missing:
        return f"{obj.__qualname__} does not set {', '.join(missing)}"
    if inspect.isabstract(obj):
        return f"{obj.__qualname__} does not implement {', '.join(sorted(obj.__abstractmethods__))}"
    return None


def _probe(record: PluginRecord) -> None:
    if record.kind == "platform":
        result = record.obj.probe()
        if not isinstance(result, ProbeResult):
            raise TypeError(f"probe() returned {type(result).__name__}, expected ProbeResult")
        record.probe = result
        if result.available:
            record.reasons = result.reasons
        else:
            record.mark(PluginStatus.UNAVAILABLE, *(result.reasons or ("probe scored 0",)))
    elif record.kind == "attention_backend":
        why = record.obj.availability()
        if why:
            record.mark(PluginStatus.UNAVAILABLE, why)
    elif record.kind == "plugin":
        manager = pluggy.PluginManager(PROJECT_NAME)
        manager.add_hookspecs(hookspecs)
        manager.register(record.obj, name=f"{record.name}@{record.entry_point}")
        manager.check_pending()


def _refuse_duplicates(records: list[PluginRecord]) -> None:
    """Two usable plugins of one kind with one name: refuse both rather than pick by install order."""
    by_name: dict[str, list[PluginRecord]] = {}
    for record in records:
        if record.status in (PluginStatus.AVAILABLE, PluginStatus.UNAVAILABLE):
            by_name.setdefault(record.name, []).append(record)
    for name, clashing in by_name.items():
        if len(clashing) < 2:
            continue
        sources = " and ".join(r.source for r in clashing)
        for record in clashing:
            if record.is_core and not all(r.is_core for r in clashing):
                continue  # core's reference entry keeps working; the newcomers are refused
            record.mark(PluginStatus.FAILED,
                        f"{record.kind.replace('_', ' ')} name '{name}' is provided by {sources}; "
                        f"uninstall one or block one by distribution name in TOKENMILL_PLUGINS")

