"""What an Apple GPU computes well through MPS."""

from __future__ import annotations

from tokenmill.plugin_api import Fp8Format, PlatformCapabilities


def metal_capabilities(macos_14_or_newer: bool) -> PlatformCapabilities:
    """MPS computes float16 everywhere; bfloat16 needs macOS 14 (Sonoma) or newer.

    Memory is unified (the GPU allocates from system RAM), there is no graph capture, and only
    gloo is available for collectives.
    """
    dtypes = ("float16", "bfloat16", "float32") if macos_14_or_newer else ("float16", "float32")
    return PlatformCapabilities(
        dtypes=dtypes,
        fp8_format=Fp8Format.NONE,
        fp8_compute=False,
        int8_dot=False,
        int4_dot=False,
        graph_capture=False,
        pinned_memory=False,
        unified_memory=True,
        collectives=("gloo",),
        families=("metal",),
    )
