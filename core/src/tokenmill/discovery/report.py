"""SelectionReport: every automatic choice and why, rendered once at startup (and by
``tokenmill plugins explain``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenmill.discovery.attention_choice import AttentionChoice
from tokenmill.discovery.kernel_choice import KernelChoice
from tokenmill.discovery.platform_choice import PlatformChoice
from tokenmill.discovery.quantizer_choice import QuantizerChoice
from tokenmill.discovery.record import PluginRecord


def _platform_line(record: PluginRecord, chosen: bool) -> str:
    mark = "*" if chosen else " "
    if record.probe is not None:
        detail = f"score {record.probe.score:<4} {'; '.join(record.probe.reasons) or '-'}"
    else:
        detail = f"{record.status.value}: {record.reason or '-'}"
    return f"    {mark} {record.name:<12} {detail}  [{record.source}]"


@dataclass
class SelectionReport:
    """The outcome of selection. ``attention`` maps layer type ("full_attention",
    "sliding_attention") to its backend choice; ``kernels`` holds one choice per linear layer."""

    platform: PlatformChoice
    platform_instance: Any = None
    dtype: str | None = None
    dtype_reason: str = ""
    attention: dict[str, AttentionChoice] = field(default_factory=dict)
    quantizer: QuantizerChoice | None = None
    quantizer_instance: Any = None
    kernels: list[KernelChoice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def render(self) -> str:
        """The multi-line, explainable startup text."""
        lines = self._platform_lines()
        if self.dtype:
            lines.append(f"dtype: {self.dtype} ({self.dtype_reason})")
        for layer_type, choice in self.attention.items():
            how = " (--attention-backend)" if choice.overridden else ""
            lines.append(f"attention backend for {layer_type.replace('_', ' ')} layers: {choice.name}{how}")
            lines += [f"    rejected {r.render()}" for r in choice.rejections]
        if self.quantizer is not None:
            lines += self._quantizer_lines()
        if self.kernels:
            lines.append("linear kernels:")
            for kernel in self.kernels:
                spec = kernel.spec
                lines.append(f"    {spec.prefix:<34} [{spec.in_features} -> {spec.out_features}] {kernel.name}")
                lines += [f"        rejected {r.render()}" for r in kernel.rejections]
        lines += [f"note: {note}" for note in self.notes]
        for warning in self.warnings:
            first, *rest = warning.splitlines()
            lines.append(f"warning: {first}")
            lines += [f"    {line}" for line in rest]
        return "\n".join(lines)

    def _platform_lines(self) -> list[str]:
        choice = self.platform
        how = f"pinned by --device {choice.pin}" if choice.pin else "highest probe score"
        described = self.platform_instance.describe() if self.platform_instance is not None else choice.name
        lines = [f"platform: {described}, device {choice.device_index} "
                 f"(score {choice.score}, {how}) [{choice.record.source}]", "    candidates:"]
        ranked = sorted(choice.candidates, key=lambda r: (r.probe is None, -(r.probe.score if r.probe else 0), r.name))
        lines += [_platform_line(r, r is choice.record) for r in ranked]
        return lines

    def _quantizer_lines(self) -> list[str]:
        choice = self.quantizer
        how = " (--quantization)" if choice.overridden else f" (confidence {choice.confidence:.2f})"
        described = self.quantizer_instance.describe() if self.quantizer_instance is not None else choice.name
        ranked = ", ".join(f"{c.name} {c.confidence:.2f}" + (" (error)" if c.error else "") for c in choice.candidates)
        return [f"quantization: {described}{how}", f"    candidates: {ranked or 'none'}"]
