"""ReferencePlatform: plain PyTorch on the CPU, the platform of last resort.

It always probes with a low score, so any installed platform that can run here (including the
optimised ``tokenmill-cpu`` plugin) wins over it, and it runs everything through the reference
attention backend and reference quantized kernels.
"""

from __future__ import annotations

import os
import platform as host

from tokenmill.plugin_api import DeviceInfo, Platform, PlatformCapabilities, ProbeResult

REFERENCE_SCORE = 1


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host.machine() or "cpu"


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class ReferencePlatform(Platform):
    """The host CPU through plain PyTorch: slow, exact, always available."""

    name = "reference"
    device_type = "cpu"
    api_version = (2, 0)
    priority = -1

    @classmethod
    def probe(cls) -> ProbeResult:
        """Always available with score 1, below every real platform."""
        cpu = DeviceInfo(index=0, name=_cpu_model_name(), total_memory=_host_memory(),
                         extra={"logical_cores": str(os.cpu_count() or 1)})
        return ProbeResult(score=REFERENCE_SCORE, reasons=("plain-PyTorch reference (path of last resort)",),
                           devices=(cpu,))

    @property
    def capabilities(self) -> PlatformCapabilities:
        """float32 first (the default compute dtype); bf16/fp16 work but are emulated and slow."""
        return PlatformCapabilities(dtypes=("float32", "bfloat16", "float16"), collectives=("gloo",))

    def attention_preference(self) -> tuple[str, ...]:
        """Only the reference paged-attention backend."""
        return ("reference",)

    def describe(self) -> str:
        """The platform and the host CPU model."""
        return f"reference (cpu: {_cpu_model_name()})"
