"""Choosing the quantization format of a checkpoint.

Every usable quantizer's ``detect(hf_config, model_path)`` gives a confidence; the highest above 0
wins and a tie at the top is an error. When nothing recognises the checkpoint, a checkpoint whose
files name a quantization format (``CheckpointFormat``) is an error naming that format, the
distribution to install and why its quantizer is not loaded; only a checkpoint that names none gets
core's ``unquantized`` format, with a note. ``--quantization NAME`` overrides detection (an error
if that format is not installed). Every candidate's confidence is kept for the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenmill.discovery.checkpoint_format import CheckpointFormat
from tokenmill.discovery.record import PluginStatus
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
        declared = CheckpointFormat.read(hf_config, model_path) if record.name == UNQUANTIZED else None
        if declared is not None:
            notes.append(f"--quantization {UNQUANTIZED}: the checkpoint is quantized as {declared.name} "
                         f"({declared.evidence}); its stored weights are read as they are")
        return QuantizerChoice(record.name, record.obj, confidence, candidates, overridden=True, notes=notes)

    declared = CheckpointFormat.read(hf_config, model_path) if best is None or best.name == UNQUANTIZED else None
    if declared is not None:
        raise unclaimed_format_error(registry, declared, candidates)
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


def unclaimed_format_error(registry: PluginRegistry, declared: CheckpointFormat,
                           candidates: Sequence[QuantCandidate] = ()) -> SelectionError:
    """The one line for a checkpoint in a format no loaded quantizer claims: the format, where the
    checkpoint says so, and what to do, with the reason its quantizer is not loaded when discovery
    knows it (blocked, refused for its API version, failed to import)."""
    head = (f"the checkpoint is quantized as {declared.name} ({declared.evidence}) and no loaded quantizer claims it, "
            f"so it cannot be loaded (read as unquantized its output would be garbage): ")
    return SelectionError(head + _why_unclaimed(registry, declared, {c.name: c for c in candidates}))


def _why_unclaimed(registry: PluginRegistry, declared: CheckpointFormat, by_name: dict[str, QuantCandidate]) -> str:
    distribution = declared.distribution
    records = [r for r in registry.records("quantizer") if not r.is_core and (
        (distribution is not None and r.distribution == distribution)
        or declared.family in (r.name, r.entry_name) or declared.name in (r.name, r.entry_name))]
    not_loaded = [r for r in records if r.status is not PluginStatus.AVAILABLE]
    if not_loaded:  # blocked first: the one a user most likely did on purpose and can undo
        record = min(not_loaded, key=lambda r: r.status is not PluginStatus.BLOCKED)
        fix = "; allow it in TOKENMILL_PLUGINS" if record.status is PluginStatus.BLOCKED else ""
        return f"quantizer '{record.name}' ({record.source}) is not loaded ({record.status.value}: {record.reason}){fix}"
    if records:
        record = records[0]
        candidate = by_name.get(record.name)
        said = candidate.error if candidate is not None and candidate.error else "its detect() gave 0"
        return f"quantizer '{record.name}' ({record.source}) does not recognise this checkpoint ({said})"
    if distribution is not None:
        return f"install {distribution} (pip install {distribution})"
    return f"tokenmill ships no quantizer for {declared.name}; install a plugin that provides it"
