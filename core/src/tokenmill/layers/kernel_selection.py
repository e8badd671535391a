"""Kernel selection for linear layers: the first of a quantizer's kernels that can run the layer here.

Every rejection keeps its reason, so the startup report and ``tokenmill plugins explain`` can say
why a faster kernel was passed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel


class NoKernelError(RuntimeError):
    """No kernel of the quantizer can run the layer on this platform."""


@dataclass(frozen=True)
class KernelVerdict:
    """One kernel's answer for one layer: ``reason`` is None when it can run it."""

    name: str
    kernel: type[QuantKernel]
    reason: str | None

    @property
    def accepted(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class KernelChoice:
    """The chosen kernel and the verdicts of the kernels tried before it."""

    kernel: type[QuantKernel]
    rejected: tuple[KernelVerdict, ...]

    def describe(self) -> str:
        """``gptq-marlin`` or ``gptq-torch (gptq-marlin: needs int4 dot products)``."""
        if not self.rejected:
            return self.kernel.name
        skipped = "; ".join(f"{v.name}: {v.reason}" for v in self.rejected)
        return f"{self.kernel.name} ({skipped})"


def ordered_kernels(quantizer: Quantizer, preference: Sequence[str] = ()) -> list[type[QuantKernel]]:
    """The quantizer's kernels with the platform's preferred names first (in preference order),
    then the rest in the quantizer's own order."""
    kernels = list(quantizer.kernels())
    rank = {name: i for i, name in enumerate(preference)}
    preferred = sorted((k for k in kernels if k.name in rank), key=lambda k: rank[k.name])
    return preferred + [k for k in kernels if k.name not in rank]


def evaluate_kernels(quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities,
                     preference: Sequence[str] = ()) -> list[KernelVerdict]:
    """Every kernel's verdict for ``spec``, in the order selection tries them."""
    return [
        KernelVerdict(kernel.name, kernel, kernel.supports(quantizer, spec, device_type, caps))
        for kernel in ordered_kernels(quantizer, preference)
    ]


def choose_kernel(quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities,
                  preference: Sequence[str] = ()) -> KernelChoice:
    """The first kernel whose ``supports`` returns None; ``NoKernelError`` listing every reason
    when none does."""
    rejected: list[KernelVerdict] = []
    for kernel in ordered_kernels(quantizer, preference):
        reason = kernel.supports(quantizer, spec, device_type, caps)
        if reason is None:
            return KernelChoice(kernel, tuple(rejected))
        rejected.append(KernelVerdict(kernel.name, kernel, reason))
    reasons = "; ".join(f"{v.name}: {v.reason}" for v in rejected) or "the quantizer offers no kernels"
    raise NoKernelError(
        f"no {quantizer.name} kernel can run {spec.prefix} ({spec.in_features} -> {spec.out_features}, "
        f"{spec.dtype}) on {device_type}: {reasons}"
    )
