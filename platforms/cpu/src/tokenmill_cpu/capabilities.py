"""What a CPU computes well, derived from its instruction-set features."""

from __future__ import annotations

from tokenmill.plugin_api import Fp8Format, PlatformCapabilities

from tokenmill_cpu.isa import has_int8_dot, has_native_bf16, has_native_fp16


def cpu_capabilities(isa: tuple[str, ...]) -> PlatformCapabilities:
    """bfloat16 leads only with native bf16 instructions, otherwise float32 does; float16 is
    listed (last: bf16-trained weights can overflow it) only with native fp16 arithmetic."""
    dtypes = ("bfloat16", "float32") if has_native_bf16(isa) else ("float32", "bfloat16")
    if has_native_fp16(isa):
        dtypes += ("float16",)
    return PlatformCapabilities(
        dtypes=dtypes,
        fp8_format=Fp8Format.NONE,
        fp8_compute=False,
        int8_dot=has_int8_dot(isa),
        int4_dot=False,
        graph_capture=False,
        pinned_memory=False,
        unified_memory=True,
        collectives=("gloo",),
        families=("cpu",),
        isa=isa,
    )
