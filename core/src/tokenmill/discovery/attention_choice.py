"""Choosing the attention backend for a layer spec on the chosen platform.

The platform's ``attention_preference()`` is walked in order; each name is checked for being
installed and usable, then asked ``validate(spec, device_type, families)``. The first backend
with no objection wins and every rejection keeps its reasons. ``--attention-backend NAME``
replaces the walk (an error with reasons if that backend cannot serve the spec). When no
preferred backend fits, core's reference backend is tried last, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.discovery.registry import PluginRegistry
from tokenmill.discovery.rejection import Rejection
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import AttentionBackend, AttentionSpec, Platform

REFERENCE_BACKEND = "reference"


@dataclass
class AttentionChoice:
    """The chosen backend class and the backends passed over before it."""

    name: str
    backend_cls: type[AttentionBackend]
    rejections: list[Rejection]
    overridden: bool = False
    notes: list[str] = field(default_factory=list)


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


def select_attention_backend(registry: PluginRegistry, platform: Platform, spec: AttentionSpec,
                             override: str | None = None) -> AttentionChoice:
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
    for name in preference:
        backend, reasons = backend_objections(registry, name, spec, device_type, families)
        if backend is not None:
            return AttentionChoice(name, backend, rejections)
        rejections.append(Rejection(name, reasons))

    notes = []
    if REFERENCE_BACKEND not in preference:
        backend, reasons = backend_objections(registry, REFERENCE_BACKEND, spec, device_type, families)
        if backend is not None:
            tried = ", ".join(preference) or "none"
            notes.append(f"no backend preferred by {platform.name} ({tried}) can serve this model; "
                         f"falling back to the reference backend")
            return AttentionChoice(REFERENCE_BACKEND, backend, rejections, notes=notes)
        rejections.append(Rejection(REFERENCE_BACKEND, reasons))
    raise SelectionError(f"no attention backend can serve this model on {where}:\n  - "
                         + "\n  - ".join(r.render() for r in rejections))
