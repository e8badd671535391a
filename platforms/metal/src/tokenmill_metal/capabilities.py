"""What an Apple GPU computes well through MPS."""

from __future__ import annotations

from tokenmill.plugin_api import PlatformCapabilities


def metal_capabilities(macos_14_or_newer: bool) -> PlatformCapabilities:
    """MPS computes float16 everywhere; bfloat16 needs macOS 14 (Sonoma) or newer.

    Memory is unified (the GPU allocates from system RAM); everything else is the contract's
    default: no fp8 or integer matrix units, no graph capture, no pinned memory, gloo collectives.
    """
    dtypes = ("float16", "bfloat16", "float32") if macos_14_or_newer else ("float16", "float32")
    return PlatformCapabilities(dtypes=dtypes, unified_memory=True, families=("metal",))
