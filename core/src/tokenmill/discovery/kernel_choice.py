"""Choosing the quantized-linear kernel for one layer shape.

Candidates are the quantizer's ``kernels()``, reordered so the names in the platform's
``quant_kernel_preference()`` come first (in the platform's order), the rest keeping the
quantizer's order. The first whose ``supports`` returns None wins; every rejection is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.discovery.rejection import Rejection
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import LinearSpec, Platform, Quantizer, QuantKernel


@dataclass
class KernelChoice:
    """The kernel for one linear layer; ``kernel_cls`` is None for a layer the format leaves in
    full precision (``Quantizer.is_quantized`` is false)."""

    spec: LinearSpec
    kernel_cls: type[QuantKernel] | None
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.kernel_cls.name if self.kernel_cls is not None else "(full precision)"


def ordered_kernels(quantizer: Quantizer, platform: Platform) -> list[type[QuantKernel]]:
    """The quantizer's kernels in the order they are tried on ``platform``."""
    kernels = list(quantizer.kernels())
    preference = list(platform.quant_kernel_preference())
    rank = {name: i for i, name in enumerate(preference)}
    return sorted(kernels, key=lambda k: (rank.get(getattr(k, "name", ""), len(rank)), kernels.index(k)))


def select_kernel(quantizer: Quantizer, spec: LinearSpec, platform: Platform) -> KernelChoice:
    """The first kernel that supports ``spec`` on ``platform``; SelectionError with every
    kernel's reason when none does."""
    if not quantizer.is_quantized(spec):
        return KernelChoice(spec, None)
    caps = platform.capabilities
    rejections = []
    for kernel in ordered_kernels(quantizer, platform):
        try:
            reason = kernel.supports(quantizer, spec, platform.device_type, caps)
        except Exception as error:  # reported as a rejection so the next kernel can still be tried
            reason = f"supports() raised {type(error).__name__}: {error}"
        if reason is None:
            return KernelChoice(spec, kernel, rejections)
        rejections.append(Rejection(getattr(kernel, "name", kernel.__qualname__), (reason,)))
    listed = "\n  - ".join(r.render() for r in rejections) or "(the format offers no kernels)"
    raise SelectionError(f"no {quantizer.name} kernel can run {spec.prefix} "
                         f"[{spec.in_features} -> {spec.out_features}, {spec.dtype}] on {platform.name}:\n  - {listed}")
