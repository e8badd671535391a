"""What an NVIDIA GPU computes well, derived from its compute capability (sm major.minor)."""

from __future__ import annotations

from tokenmill.plugin_api import Fp8Format, PlatformCapabilities


def cuda_capabilities(compute_capability: tuple[int, int]) -> PlatformCapabilities:
    """Capabilities of a GPU with ``compute_capability`` (e.g. ``(9, 0)`` for H100)."""
    cc = (int(compute_capability[0]), int(compute_capability[1]))
    has_bf16 = cc >= (8, 0)  # Ampere and newer have bf16 tensor cores
    has_fp8 = cc >= (8, 9)  # Ada and Hopper introduced OCP e4m3/e5m2 tensor cores
    return PlatformCapabilities(
        dtypes=("bfloat16", "float16", "float32") if has_bf16 else ("float16", "float32"),
        fp8_format=Fp8Format.OCP if has_fp8 else Fp8Format.NONE,
        fp8_compute=has_fp8,
        int8_dot=cc >= (7, 5),
        int4_dot=(7, 5) <= cc < (9, 0),  # Turing to Ada have int4 MMA; Hopper dropped it
        graph_capture=True,
        pinned_memory=True,
        unified_memory=False,
        collectives=("nccl", "gloo"),
        families=("cuda-compatible", "triton"),
    )
