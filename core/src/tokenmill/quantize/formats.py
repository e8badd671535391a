"""Which installed quantization formats can write checkpoints, which options each takes, and the
call that writes one: the registry between ``tokenmill quantize`` and the format plugins."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenmill.discovery import PluginRegistry
from tokenmill.plugin_api import Quantizer


def writable_formats(registry: PluginRegistry) -> dict[str, type[Quantizer]]:
    """Available quantizers that implement ``quantize_checkpoint``, by name."""
    formats = {}
    for record in registry.available("quantizer"):
        cls = record.obj
        method = getattr(cls, "quantize_checkpoint", None)
        if method is not None and getattr(method, "__func__", None) is not Quantizer.quantize_checkpoint.__func__:
            formats.setdefault(cls.name, cls)
    return formats


def format_options(cls: type[Quantizer]) -> dict[str, Any]:
    """The keyword-only options of ``cls.quantize_checkpoint`` (or of the function it wraps, see
    ``functools.wraps``) with their defaults."""
    parameters = inspect.signature(cls.quantize_checkpoint).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY}


def quantize_model(registry: PluginRegistry, format_name: str, model_dir: str | Path, out_dir: str | Path,
                   **options: Any) -> Mapping[str, Any]:
    """Write ``model_dir`` quantized to ``format_name`` into ``out_dir``; returns the
    ``quantization_config`` written. ``ValueError`` for an unknown format or an option it does not take."""
    formats = writable_formats(registry)
    cls = formats.get(format_name)
    if cls is None:
        known = ", ".join(sorted(formats)) or "none installed"
        raise ValueError(f"no installed quantization format named {format_name!r} can write checkpoints "
                         f"(formats: {known})")
    accepted = format_options(cls)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        flags = ", ".join("--" + name.replace("_", "-") for name in unknown)
        takes = ", ".join("--" + name.replace("_", "-") for name in accepted) or "no options"
        raise ValueError(f"the {format_name} format does not take {flags} (it takes: {takes})")
    return cls.quantize_checkpoint(str(model_dir), str(out_dir), **options)
