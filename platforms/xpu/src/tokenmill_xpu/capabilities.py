"""What an Intel GPU computes well, derived from ``torch.xpu.get_device_properties``."""

from __future__ import annotations

from typing import Any

from tokenmill.plugin_api import Fp8Format, PlatformCapabilities


def xpu_capabilities(props: Any, graph_capture: bool) -> PlatformCapabilities:
    """Capabilities of a device with properties ``props`` (an ``_XpuDeviceProperties``).

    XMX matrix engines (``has_subgroup_matrix_multiply_accumulate``, "DPAS") compute bf16, fp16
    and int8; without them bf16 is only converted, so fp16 leads. Current Xe GPUs have no fp8
    matrix units, so fp8 is left to weight-only kernels.
    """
    xmx = bool(getattr(props, "has_subgroup_matrix_multiply_accumulate", False))
    bf16 = bool(getattr(props, "has_bfloat16_conversions", False))
    fp16 = bool(getattr(props, "has_fp16", True))
    dtypes: list[str] = []
    if bf16 and xmx:
        dtypes.append("bfloat16")
    if fp16:
        dtypes.append("float16")
    if bf16 and not xmx:
        dtypes.append("bfloat16")
    dtypes.append("float32")
    return PlatformCapabilities(
        dtypes=tuple(dtypes),
        fp8_format=Fp8Format.NONE,
        fp8_compute=False,
        int8_dot=xmx,
        int4_dot=False,
        graph_capture=graph_capture,
        pinned_memory=True,
        unified_memory=bool(getattr(props, "is_integrated_gpu", False)),
        collectives=("xccl", "gloo"),
        families=("triton", "xpu"),
    )
