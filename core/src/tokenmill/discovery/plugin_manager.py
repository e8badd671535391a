"""The pluggy PluginManager for general plugins (``tokenmill.plugins``), and the hooks whose
results are merged with attribution (``configure``, ``register_models``).

Merging hooks call each implementation separately, in registration order (core's built-ins first,
then plugins sorted by name), so every result is attributed to its plugin and a clash names both.
Wrapper implementations are not used by these hooks.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pluggy

from tokenmill.discovery.registry import PluginRegistry
from tokenmill.plugin_api import PROJECT_NAME, hookspecs


class PluginConflictError(ValueError):
    """Two plugins asked for incompatible things (one config field, one model architecture)."""


@dataclass(frozen=True)
class Contribution:
    """One value a plugin contributed, with the plugin's name for the startup report."""

    value: Any
    plugin: str


def build_plugin_manager(registry: PluginRegistry, builtins: Iterable[str] = ()) -> pluggy.PluginManager:
    """A PluginManager with core's hookspecs, the modules named in ``builtins`` (core's own hook
    implementations, registered under their module names) and every available plugin of the
    registry (its ``tokenmill.plugins`` entry points, already checked against the allow/deny list)."""
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    for module_name in builtins:
        manager.register(importlib.import_module(module_name), name=module_name)
    for record in sorted(registry.available("plugin"), key=lambda r: r.name):
        if not manager.is_registered(record.obj):  # two entry points may name one module
            manager.register(record.obj, name=record.name)
    manager.check_pending()
    return manager


def ordered_hookimpls(manager: pluggy.PluginManager, hook_name: str) -> list[Any]:
    """A hook's non-wrapper implementations in registration order (pluggy itself calls them LIFO)."""
    order = {name: i for i, (name, _) in enumerate(manager.list_name_plugin())}
    impls = [impl for impl in getattr(manager.hook, hook_name).get_hookimpls() if not (impl.hookwrapper or impl.wrapper)]
    return sorted(impls, key=lambda impl: order.get(impl.plugin_name, len(order)))


def call_each(impl: Any, **kwargs: Any) -> Any:
    """Call one hook implementation with the arguments it asks for."""
    return impl.function(*[kwargs[name] for name in impl.argnames])


def collect_config_overrides(manager: pluggy.PluginManager, config: Mapping[str, Any]) -> dict[str, Contribution]:
    """Every plugin's ``configure`` overrides, by field. Two plugins setting one field to different
    values is a ``PluginConflictError`` naming both; agreeing plugins are fine (the first is named)."""
    view = MappingProxyType(dict(config))
    merged: dict[str, Contribution] = {}
    for impl in ordered_hookimpls(manager, "configure"):
        overrides = call_each(impl, config=view) or {}
        if not isinstance(overrides, Mapping):
            raise TypeError(f"plugin '{impl.plugin_name}' configure() returned {type(overrides).__name__}, expected a dict")
        for key, value in overrides.items():
            earlier = merged.get(key)
            if earlier is not None and earlier.value != value:
                raise PluginConflictError(
                    f"plugins '{earlier.plugin}' and '{impl.plugin_name}' both override '{key}' "
                    f"({earlier.value!r} vs {value!r}); block one of them with TOKENMILL_PLUGINS")
            merged.setdefault(key, Contribution(value, impl.plugin_name))
    return merged


def collect_models(manager: pluggy.PluginManager) -> dict[str, Contribution]:
    """Every plugin's ``register_models`` result merged by architecture name; two plugins naming
    one architecture is a ``PluginConflictError`` naming both (even if the targets agree)."""
    merged: dict[str, Contribution] = {}
    for impl in ordered_hookimpls(manager, "register_models"):
        models = call_each(impl) or {}
        if not isinstance(models, Mapping):
            raise TypeError(f"plugin '{impl.plugin_name}' register_models() returned {type(models).__name__}, expected a dict")
        for architecture, target in models.items():
            earlier = merged.get(architecture)
            if earlier is not None:
                raise PluginConflictError(
                    f"architecture '{architecture}' is registered by both '{earlier.plugin}' ({earlier.value}) "
                    f"and '{impl.plugin_name}' ({target}); block one of them with TOKENMILL_PLUGINS")
            merged[architecture] = Contribution(target, impl.plugin_name)
    return merged
