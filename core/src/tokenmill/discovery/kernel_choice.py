"""Choosing the linear kernel for one layer shape: the one selector behind model building and
``tokenmill plugins explain``.

Candidates are the kernels of the format that stores the layer (the checkpoint's quantizer, or core's
``unquantized`` format for a layer the quantizer leaves in full precision), then the platform's own
``linear_kernels()`` for plain float weights: as they are for a full-precision layer, and for a
quantized layer as a stand-in for each of the format's plain-weight kernels (``stand_in``). The names
in the platform's ``quant_kernel_preference()`` come first, in the platform's order (a stand-in counts
under its platform kernel's name unless the platform names the stand-in itself); the rest keep their
order. The first whose ``supports`` returns None wins; every rejection is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from tokenmill.discovery.rejection import Rejection
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import LinearSpec, Platform, PlatformCapabilities, Quantizer, QuantKernel


@dataclass(frozen=True)
class KernelTarget:
    """What kernel selection asks of the platform: its name (for messages), device type, capabilities,
    kernel preference and its own kernels for plain float weights."""

    name: str
    device_type: str
    capabilities: PlatformCapabilities
    preference: tuple[str, ...] = ()
    linear_kernels: tuple[type[QuantKernel], ...] = ()

    @classmethod
    def of(cls, platform: Platform) -> KernelTarget:
        """The target an activated (or merely instantiated, for a dry run) platform describes."""
        return cls(platform.name, platform.device_type, platform.capabilities,
                   tuple(platform.quant_kernel_preference()), tuple(platform.linear_kernels()))


@dataclass(frozen=True)
class KernelChoice:
    """The kernel for one linear layer, the format that stores it (``full_precision`` when the
    checkpoint's format leaves the layer unquantized and core's ``unquantized`` format holds it) and
    the kernels tried before it, with their reasons."""

    spec: LinearSpec
    quantizer: Quantizer
    kernel: type[QuantKernel]
    rejections: tuple[Rejection, ...] = ()
    full_precision: bool = False

    @property
    def name(self) -> str:
        """The kernel's name as the report shows it: ``gptq-marlin``, ``torch-linear (full precision)``."""
        return f"{self.kernel.name} (full precision)" if self.full_precision else self.kernel.name


@cache
def stand_in(platform_kernel: type[QuantKernel], format_kernel: type[QuantKernel]) -> type[QuantKernel]:
    """``platform_kernel`` running the layers of ``format_kernel`` (a plain-weight kernel): named
    ``<format kernel>+<platform kernel>``, it accepts a layer where both accept it, computes with the
    platform kernel and keeps the format kernel's other attributes (the layout its format creates
    for it). The same pair always gives the same class."""

    def supports(cls: Any, quantizer: Quantizer, spec: LinearSpec, device_type: str,
                 caps: PlatformCapabilities) -> str | None:
        return (format_kernel.supports(quantizer, spec, device_type, caps)
                or platform_kernel.supports(quantizer, spec, device_type, caps))

    return type(f"{platform_kernel.__name__}For{format_kernel.__name__}", (platform_kernel, format_kernel), {
        "__doc__": f"{platform_kernel.name} on the plain weights of {format_kernel.name}.",
        "name": f"{format_kernel.name}+{platform_kernel.name}",
        "platform_kernel": platform_kernel,
        "supports": classmethod(supports),
    })


def candidate_kernels(quantizer: Quantizer, spec: LinearSpec, target: KernelTarget) -> list[type[QuantKernel]]:
    """The kernels that may run ``spec`` (stored by ``quantizer``) on ``target``, in the order tried."""
    own = list(quantizer.kernels())
    if quantizer.is_quantized(spec):
        extra = [stand_in(p, k) for p in target.linear_kernels for k in own if k.plain_weight]
    else:
        extra = list(target.linear_kernels)
    return ordered_kernels(own + extra, target.preference)


def ordered_kernels(kernels: Sequence[type[QuantKernel]], preference: Sequence[str]) -> list[type[QuantKernel]]:
    """``kernels`` with the preferred names first, in preference order, the rest in their own order."""
    rank = {name: i for i, name in enumerate(preference)}

    def position(kernel: type[QuantKernel]) -> int:
        name = getattr(kernel, "name", "")
        platform_kernel = getattr(kernel, "platform_kernel", None)
        if name not in rank and platform_kernel is not None:
            name = platform_kernel.name
        return rank.get(name, len(rank))

    return sorted(kernels, key=position)  # stable: equal ranks keep their order


def select_kernel(quantizer: Quantizer, spec: LinearSpec, target: KernelTarget) -> KernelChoice:
    """The first kernel that supports ``spec`` on ``target``; a layer ``quantizer`` leaves unquantized
    is held by core's ``unquantized`` format. SelectionError with every kernel's reason when none does."""
    from tokenmill.reference.unquantized import Unquantized  # imports torch

    full_precision = not quantizer.is_quantized(spec)
    if full_precision and not isinstance(quantizer, Unquantized):
        quantizer = Unquantized()
    rejections = []
    for kernel in candidate_kernels(quantizer, spec, target):
        try:
            reason = kernel.supports(quantizer, spec, target.device_type, target.capabilities)
        except Exception as error:  # reported as a rejection so the next kernel can still be tried
            reason = f"supports() raised {type(error).__name__}: {error}"
        if reason is None:
            return KernelChoice(spec, quantizer, kernel, tuple(rejections), full_precision)
        rejections.append(Rejection(getattr(kernel, "name", kernel.__qualname__), (reason,)))
    listed = "\n  - ".join(r.render() for r in rejections) or "(the format offers no kernels)"
    raise SelectionError(f"no {quantizer.name} kernel can run {spec.prefix} "
                         f"[{spec.in_features} -> {spec.out_features}, {spec.dtype}] on {target.name}:\n  - {listed}")
