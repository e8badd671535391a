"""What a CPU computes well, derived from its instruction-set features."""

from __future__ import annotations

from tokenmill.plugin_api import Fp8Format, PlatformCapabilities
from tokenmill_cpu.isa import has_int8_dot, has_native_bf16, has_native_fp16

# A CPU graph keeps every activation of its forward alive (about 1.2 MiB per row for a 135M-parameter
# model), on memory all of the platform's graphs share (ActivationArena). With the panel matmul a
# dense float32 step is native calls only at every size; at 64 requests replaying them instead of
# running the modules took 11 % off SmolLM2's decode steps. Past this size the kernels dominate.
GRAPH_MAX_BATCH = 64
# One request's prefill chunk up to this many tokens replays a graph too (padded to 8, 16, ... 64, 80, ...):
# for a 46-token prompt the kernels took 59 ms of an 80 ms forward, the Python between them the rest.
# The largest prefill graph sizes the shared activation memory (152 MiB for SmolLM2).
PREFILL_GRAPH_MAX_TOKENS = 128


def cpu_capabilities(isa: tuple[str, ...]) -> PlatformCapabilities:
    """bfloat16 leads only with native bf16 instructions, otherwise float32 does; float16 is
    listed (last: bf16-trained weights can overflow it) only with native fp16 arithmetic. Decode
    graphs (``CpuDecodeGraph``) are offered up to ``GRAPH_MAX_BATCH`` requests."""
    dtypes = ("bfloat16", "float32") if has_native_bf16(isa) else ("float32", "bfloat16")
    if has_native_fp16(isa):
        dtypes += ("float16",)
    return PlatformCapabilities(
        dtypes=dtypes,
        fp8_format=Fp8Format.NONE,
        fp8_compute=False,
        int8_dot=has_int8_dot(isa),
        int4_dot=False,
        graph_capture=True,
        graph_max_batch=GRAPH_MAX_BATCH,
        prefill_graph_max_tokens=PREFILL_GRAPH_MAX_TOKENS,
        pinned_memory=False,
        unified_memory=True,
        collectives=("gloo",),
        families=("cpu",),
        isa=isa,
    )
