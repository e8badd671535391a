"""Triton availability for a platform, and the interpreter mode tests run Triton kernels in.

A platform declares that Triton compiles for its device by listing ``"triton"`` in
``PlatformCapabilities.families``; a kernel plugin asks ``triton_unavailable`` instead of keeping
its own list of device types. On the CPU Triton only interprets (``TRITON_INTERPRET=1``): good for
tests on CPU tensors, never a serving choice. Importing this module does not import triton.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from tokenmill.plugin_api.platform import PlatformCapabilities

TRITON_FAMILY = "triton"
"""The capability family a platform lists when Triton compiles kernels for its device."""

CPU_REASON = "on the CPU Triton runs only as its slow interpreter (TRITON_INTERPRET=1, for tests), not for serving"
"""Why a Triton kernel is never chosen for a CPU device."""

NOT_INSTALLED_REASON = "the triton package is not installed (pip install 'triton>=3.0')"
"""Why a Triton kernel cannot run where the triton package is missing."""

TILE_DTYPES = ("float32", "float16", "bfloat16")
"""The compute dtypes the ``triton_tiles`` matmul kernels take activations in."""

_TRUE_VALUES = ("1", "true", "on", "yes")


def triton_unavailable(device_type: str, caps: PlatformCapabilities) -> str | None:
    """Why Triton kernels cannot serve on ``device_type`` with capabilities ``caps``, or None when
    they can: never on the CPU, only on a platform of the ``"triton"`` family, and only with the
    triton package installed (looked up, not imported)."""
    if device_type == "cpu":
        return CPU_REASON
    if TRITON_FAMILY not in caps.families:
        return f"Triton has no backend for {device_type!r} devices (the platform does not list the 'triton' family)"
    if importlib.util.find_spec("triton") is None:
        return NOT_INSTALLED_REASON
    return None


def tile_kernel_unavailable(device_type: str, caps: PlatformCapabilities, dtype: str) -> str | None:
    """``triton_unavailable``, then whether compute dtype ``dtype`` is one of ``TILE_DTYPES``: the
    checks every ``triton_tiles`` matmul kernel's ``supports`` starts with."""
    reason = triton_unavailable(device_type, caps)
    if reason is None and dtype not in TILE_DTYPES:
        reason = f"compute dtype {dtype} is not one of {', '.join(TILE_DTYPES)}"
    return reason


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for interpreted kernels. Triton reads the variable when a
    kernel is decorated, so this says how kernels decorated from now on will run."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in _TRUE_VALUES


def is_interpreted(kernel: Any) -> bool:
    """Whether the decorated ``kernel`` (a ``triton.jit`` result) runs in the interpreter: true
    when ``TRITON_INTERPRET`` was on as its module was imported."""
    return type(kernel).__name__ == "InterpretedFunction"


def refuse_cpu_tensors(tensor: Any, kernel_name: str, interpreted: bool) -> None:
    """Raise ``RuntimeError`` when a compiled (not ``interpreted``) Triton kernel named
    ``kernel_name`` is handed a CPU ``tensor``: only the interpreter reads CPU memory."""
    if tensor.device.type == "cpu" and not interpreted:
        raise RuntimeError(f"the {kernel_name} got CPU tensors: {CPU_REASON}")
