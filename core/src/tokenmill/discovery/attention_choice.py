"""Choosing the attention backend for a layer spec on the chosen platform.

The platform's ``attention_preference()`` is walked in order; each name is checked for being
installed and usable, then asked ``validate(spec, device_type, families)``. The first backend
with no objection wins and every rejection keeps its reasons. ``--attention-backend NAME``
replaces the walk (an error with reasons if that backend cannot serve the spec, whatever else is
allowed). Never silent:

* a preferred backend that is broken (it failed to import or check, or was refused for its plugin
  API version) is an error naming it and its reason, unless ``allow_fallback``
  (``--allow-attention-fallback``) is set, which passes over it with a startup warning;
* when no preferred backend fits and the platform does not prefer core's reference backend, running
  on the reference backend also needs ``allow_fallback`` (and warns); a backend that is merely
  unavailable here, not installed, blocked by ``TOKENMILL_PLUGINS`` or rejects the layer is an
  ordinary rejection, reported with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.discovery.record import BROKEN, PluginRecord
from tokenmill.discovery.registry import PluginRegistry
from tokenmill.discovery.rejection import Rejection
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import AttentionBackend, AttentionSpec, Platform

REFERENCE_BACKEND = "reference"
FALLBACK_FLAG = "--allow-attention-fallback"


@dataclass
class AttentionChoice:
    """The chosen backend class and the backends passed over before it."""

    name: str
    backend_cls: type[AttentionBackend]
    rejections: list[Rejection]
    overridden: bool = False
    warnings: list[str] = field(default_factory=list)  # fallbacks taken under allow_fallback


def backend_objections(registry: PluginRegistry, name: str, spec: AttentionSpec, device_type: str,
                       families: tuple[str, ...]) -> tuple[type[AttentionBackend] | None, tuple[str, ...]]:
    """(backend class, ()) when ``name`` can serve ``spec`` here, else (None, reasons)."""
    records = registry.find("attention_backend", name)
    if not records:
        installed = ", ".join(registry.names("attention_backend")) or "none"
        return None, (f"not installed (installed: {installed})",)
    usable = [r for r in records if r.available]
    if not usable:
        return None, tuple(f"{r.status.value}: {'; '.join(r.reasons) or '-'}" for r in records)
    backend = usable[0].obj
    try:
        reasons = tuple(backend.validate(spec, device_type, families))
    except Exception as error:  # a validate() that raises is a rejection with a reason, not a crash
        reasons = (f"validate() raised {type(error).__name__}: {error}",)
    return (None, reasons) if reasons else (backend, ())


def _broken_records(registry: PluginRegistry, name: str) -> list[PluginRecord]:
    """The records named ``name`` that failed or were refused, when none of that name is usable."""
    records = registry.find("attention_backend", name)
    if any(r.available for r in records):
        return []
    return [r for r in records if r.status in BROKEN]


def select_attention_backend(registry: PluginRegistry, platform: Platform, spec: AttentionSpec,
                             override: str | None = None, allow_fallback: bool = False) -> AttentionChoice:
    """Choose the backend for ``spec`` on ``platform`` (an instance; its capabilities supply the
    family tags). See the module docstring for the rules."""
    device_type = platform.device_type
    families = tuple(platform.capabilities.families)
    where = f"{platform.name} ({device_type})"

    if override:
        backend, reasons = backend_objections(registry, override, spec, device_type, families)
        if backend is None:
            raise SelectionError(f"--attention-backend {override} cannot serve this model on {where}:\n  - "
                                 + "\n  - ".join(reasons))
        return AttentionChoice(override, backend, [], overridden=True)

    preference = list(dict.fromkeys(platform.attention_preference()))
    rejections: list[Rejection] = []
    passed_over: list[str] = []
    for name in preference:
        broken = _broken_records(registry, name)
        if broken and not allow_fallback:
            record = broken[0]
            raise SelectionError(
                f"attention backend '{name}' ({record.source}), preferred by platform {platform.name}, is "
                f"{record.status.value}: {record.reason}; repair or reinstall it, or pass {FALLBACK_FLAG} to use "
                f"the platform's next preference")
        backend, reasons = backend_objections(registry, name, spec, device_type, families)
        if backend is not None:
            return AttentionChoice(name, backend, rejections, warnings=_fallback_warnings(passed_over, name, platform))
        if broken:
            passed_over.append(f"{name} ({broken[0].status.value})")
        rejections.append(Rejection(name, reasons))

    if REFERENCE_BACKEND not in preference:
        backend, reasons = backend_objections(registry, REFERENCE_BACKEND, spec, device_type, families)
        tried = ", ".join(preference) or "none"
        if backend is not None and allow_fallback:
            warnings = _fallback_warnings(passed_over, REFERENCE_BACKEND, platform)
            warnings.append(f"no attention backend preferred by platform {platform.name} ({tried}) can serve this "
                            f"model; running on core's reference backend ({FALLBACK_FLAG})")
            return AttentionChoice(REFERENCE_BACKEND, backend, rejections, warnings=warnings)
        if backend is not None:
            raise SelectionError(f"no attention backend preferred by platform {platform.name} ({tried}) can serve "
                                 f"this model on {where}; pass {FALLBACK_FLAG} to run it on core's reference "
                                 f"backend:\n  - " + "\n  - ".join(r.render() for r in rejections))
        rejections.append(Rejection(REFERENCE_BACKEND, reasons))
    raise SelectionError(f"no attention backend can serve this model on {where}:\n  - "
                         + "\n  - ".join(r.render() for r in rejections))


def _fallback_warnings(passed_over: list[str], chosen: str, platform: Platform) -> list[str]:
    if not passed_over:
        return []
    return [f"attention backend {', '.join(passed_over)} preferred by platform {platform.name} is broken; "
            f"using '{chosen}' instead ({FALLBACK_FLAG})"]
