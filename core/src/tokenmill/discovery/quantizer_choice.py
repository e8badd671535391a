"""Choosing the quantization format of a checkpoint.

Every usable quantizer's ``detect(hf_config, model_path)`` gives a confidence; the highest above 0
wins, a tie at the top is an error, and when nothing recognises the checkpoint core's
``unquantized`` format is used with a note. ``--quantization NAME`` overrides detection (an error
if that format is not installed). Every candidate's confidence is kept for the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenmill.discovery.registry import PluginRegistry
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import Quantizer

UNQUANTIZED = "unquantized"


@dataclass(frozen=True)
class QuantCandidate:
    """One format's answer to ``detect``; ``error`` is set when detect raised."""

    name: str
    confidence: float
    error: str | None = None


@dataclass
class QuantizerChoice:
    """The chosen format with every candidate's confidence, best first."""

    name: str
    quantizer_cls: type[Quantizer]
    confidence: float
    candidates: list[QuantCandidate]
    overridden: bool = False
    notes: list[str] = field(default_factory=list)


def rank_quantizers(registry: PluginRegistry, hf_config: Mapping[str, Any], model_path: str) -> list[QuantCandidate]:
    """Every usable format's confidence for the checkpoint, best first (ties by name)."""
    candidates = []
    for record in registry.available("quantizer"):
        try:
            confidence = float(record.obj.detect(hf_config, model_path))
            candidates.append(QuantCandidate(record.name, max(0.0, min(1.0, confidence))))
        except Exception as error:  # one broken detector must not hide the others; it is reported
            candidates.append(QuantCandidate(record.name, 0.0, f"detect() raised {type(error).__name__}: {error}"))
    return sorted(candidates, key=lambda c: (-c.confidence, c.name))


def select_quantizer(registry: PluginRegistry, hf_config: Mapping[str, Any], model_path: str,
                     override: str | None = None) -> QuantizerChoice:
    """Choose the checkpoint's format; see the module docstring."""
    candidates = rank_quantizers(registry, hf_config, model_path)
    by_name = {c.name: c for c in candidates}
    notes = [f"quantizer '{c.name}' {c.error}" for c in candidates if c.error]
    best = candidates[0] if candidates and candidates[0].confidence > 0 else None

    if override:
        usable = [r for r in registry.available("quantizer") if override in (r.name, r.entry_name)]
        if not usable:
            records = registry.find("quantizer", override)
            if records:
                why = "; ".join(f"{r.status.value}: {r.reason}" for r in records)
                raise SelectionError(f"--quantization {override} cannot be used: {why}")
            installed = ", ".join(registry.names("quantizer")) or "none"
            raise SelectionError(f"--quantization {override}: no such quantization format is installed "
                                 f"(installed: {installed})")
        record = usable[0]
        confidence = by_name[record.name].confidence
        if best is not None and best.name != record.name:
            notes.append(f"--quantization {record.name} overrides the detected format {best.name} "
                         f"(confidence {best.confidence:.2f})")
        elif confidence == 0:
            notes.append(f"--quantization {record.name}: the checkpoint does not look like this format "
                         f"(detect() confidence 0)")
        return QuantizerChoice(record.name, record.obj, confidence, candidates, overridden=True, notes=notes)

    if best is not None:
        tied = [c for c in candidates if c.confidence == best.confidence]
        if len(tied) > 1:
            listed = ", ".join(f"{c.name} ({c.confidence:.2f})" for c in tied)
            raise SelectionError(f"quantization formats tie for this checkpoint: {listed}; "
                                 f"choose one with --quantization")
        record = registry.find("quantizer", best.name)[0]
        return QuantizerChoice(best.name, record.obj, best.confidence, candidates, notes=notes)

    fallback = [r for r in registry.available("quantizer") if r.name == UNQUANTIZED]
    if not fallback:
        raise SelectionError("no quantization format recognises this checkpoint and core's 'unquantized' format "
                             "is not available: " + ", ".join(f"{c.name} ({c.confidence:.2f})" for c in candidates))
    notes.append("no quantization format recognised the checkpoint; treating it as unquantized")
    return QuantizerChoice(UNQUANTIZED, fallback[0].obj, 0.0, candidates, notes=notes)
