"""The CPU platform: tuned for the host's instruction set, thread count and RAM."""

from __future__ import annotations

import logging
import os
import platform as host
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from tokenmill.plugin_api import (
    Communicator,
    DeviceInfo,
    LayerKernels,
    MemoryInfo,
    Platform,
    PlatformCapabilities,
    ProbeResult,
)
from tokenmill_cpu.capabilities import cpu_capabilities
from tokenmill_cpu.cpuinfo import read_cpuinfo
from tokenmill_cpu.host_allocator import tune_host_allocator
from tokenmill_cpu.host_memory import host_memory
from tokenmill_cpu.isa import has_native_bf16, isa_features
from tokenmill_cpu.threads import available_cpus, pin_threads

logger = logging.getLogger(__name__)

KV_CACHE_FRACTION = 0.25  # of available RAM, when the user did not size the cache
KV_CACHE_CAP = 32 << 30  # bytes; more only helps with very long contexts, which CPUs serve slowly
LAYER_KERNELS_ENV = "TOKENMILL_CPU_LAYER_KERNELS"
SHARED_MEMORY_ENV = "TOKENMILL_CPU_SHARED_MEMORY_COMMUNICATOR"


class CpuPlatform(Platform):
    """Any CPU. Always scores 50: above core's generic reference platform, below accelerators."""

    name = "cpu"
    device_type = "cpu"
    api_version = (2, 0)

    cpuinfo_path = "/proc/cpuinfo"
    meminfo_path = "/proc/meminfo"
    _graph_arena: Any = None  # the ActivationArena of this platform's graphs, made with the first one
    _linear_kernels: tuple[type[Any], ...] | None = None  # made at the first ``linear_kernels`` call

    @classmethod
    def probe(cls) -> ProbeResult:
        """Read ``/proc/cpuinfo``, ``/proc/meminfo`` and the affinity mask; nothing is initialised."""
        import torch

        info = read_cpuinfo(cls.cpuinfo_path)
        isa = isa_features(info.flags)
        cpus = available_cpus()
        cores = info.physical_cores(cpus)
        torch_isa = torch.backends.cpu.get_cpu_capability()
        dtype = "bfloat16" if has_native_bf16(isa) else "float32"
        reasons = (
            f"{host.machine()} CPU: {len(cpus)} logical CPUs on {cores} physical cores available",
            f"ISA {', '.join(isa) or 'baseline'}; torch kernels {torch_isa}",
            f"default dtype {dtype} ({'native' if dtype == 'bfloat16' else 'no native'} bf16 dot products)",
        )
        device = DeviceInfo(
            index=0,
            name=info.model_name or host.processor() or host.machine(),
            total_memory=host_memory(cls.meminfo_path).total,
            extra={"isa": " ".join(isa), "torch_cpu_capability": torch_isa, "physical_cores": str(cores)},
        )
        return ProbeResult(50, reasons, (device,))

    @cached_property
    def physical_cores(self) -> int:
        """Physical cores among the CPUs this process may use."""
        return read_cpuinfo(self.cpuinfo_path).physical_cores(available_cpus())

    def activate(self) -> None:
        """One torch thread per available physical core (hyper-threads only add contention in
        matmul-bound code), unless ``OMP_NUM_THREADS`` says otherwise; glibc malloc told to keep
        freed activation memory (``host_allocator``; ``TOKENMILL_CPU_KEEP_MALLOC=1`` opts out)."""
        if self.device_index != 0:
            raise ValueError(f"the CPU platform has a single device (cpu), not cpu:{self.device_index}")
        pin_threads(self.physical_cores)
        logger.info("cpu platform: %s", tune_host_allocator())

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """Derived from the ``/proc/cpuinfo`` feature flags."""
        return cpu_capabilities(isa_features(read_cpuinfo(self.cpuinfo_path).flags))

    def memory_info(self) -> MemoryInfo:
        """Total RAM and ``MemAvailable``."""
        return host_memory(self.meminfo_path)

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """Zeros over a fresh anonymous mapping (``zeroed_tensor``): nothing is written, pages are backed
        on first write or by ``back_kv_cache``."""
        from tokenmill_cpu.zeroed_memory import zeroed_tensor  # imports torch

        return zeroed_tensor(shape, dtype)

    def back_kv_cache(self, cache: Any, block_dim: int, start: int, stop: int) -> bool:
        """``madvise(MADV_POPULATE_WRITE)`` over the blocks' pages (Linux 5.14+; False elsewhere)."""
        from tokenmill_cpu.kv_cache_pages import back_blocks  # imports torch

        return back_blocks(cache, block_dim, start, stop)

    def attention_preference(self) -> tuple[str, ...]:
        """The optimised CPU backend when installed, else the plain-PyTorch reference."""
        return ("cpu", "reference")

    def quant_kernel_preference(self) -> tuple[str, ...]:
        """oneDNN linear on reordered weights for full-precision layers and, standing in for a format's
        plain-weight kernel, for dequantized GGUF layers; with GGUF's packed mode, its C kernel over the
        raw blocks."""
        return ("onednn-linear", "gguf-packed-cpu")

    def linear_kernels(self) -> tuple[type[Any], ...]:
        """``OneDnnLinearKernel`` for plain float32 / bfloat16 weights, its decode-step rows multiplied by
        this platform's ``SmallBatchLinear`` where the layer kernels are on."""
        if self._linear_kernels is None:
            from tokenmill_cpu.onednn_linear import OneDnnLinearKernel  # imports torch

            self._linear_kernels = (OneDnnLinearKernel.using(lambda: self._small_batch_linear),)
        return self._linear_kernels

    @cached_property
    def _small_batch_linear(self) -> Any:
        """The ``SmallBatchLinear`` of this platform's linear kernel, made at its first use (a model
        build); None with ``TOKENMILL_CPU_LAYER_KERNELS=0`` or where the layer kernels cannot be built."""
        if os.environ.get(LAYER_KERNELS_ENV, "1") == "0":
            return None
        from tokenmill_cpu.layer_kernels import layer_ops_unavailable  # imports torch
        from tokenmill_cpu.small_batch_linear import SmallBatchLinear
        from tokenmill_cpu.split_bf16_matmul import PRECISION_ENV, fp32_matmul_precision

        if layer_ops_unavailable() is not None:  # ``layer_kernels`` says why
            return None
        matmuls = SmallBatchLinear(split_bf16=fp32_matmul_precision() == "bf16x3")
        if matmuls.split_bf16:
            logger.info("cpu platform: float32 matrix products of 3+ rows in bf16x3 on AMX (three bfloat16 "
                        "products each, relative error ~2^-14); %s=ieee keeps float32 arithmetic", PRECISION_ENV)
        return matmuls

    def create_graph(self) -> Any:
        """A new CpuDecodeGraph: a decode (or prefill) forward recorded as its native kernel calls,
        declined (steps run eagerly) when the forward also runs PyTorch operations. The graphs of
        this platform share one ActivationArena."""
        from tokenmill_cpu.decode_graph import ActivationArena, CpuDecodeGraph  # imports torch

        if self._graph_arena is None:
            self._graph_arena = ActivationArena()
        return CpuDecodeGraph(self._graph_arena)

    def layer_kernels(self) -> LayerKernels | None:
        """RMSNorm, rotary, SiluAndMul, row gathers and greedy argmaxes in C (``CpuLayerKernels``) when a C
        compiler can build them, the greedy LM head estimated in int8 for one or two rows and in bfloat16
        for more where the ISA multiplies it natively; ``TOKENMILL_CPU_LAYER_KERNELS=0`` keeps core's
        PyTorch code (and oneDNN for every row count of the linear layers)."""
        if os.environ.get(LAYER_KERNELS_ENV, "1") == "0":
            return None
        from tokenmill_cpu.layer_kernels import CpuLayerKernels, layer_ops_unavailable  # imports torch

        reason = layer_ops_unavailable()
        if reason is not None:
            logger.warning("cpu platform: layer kernels unavailable, using PyTorch ops: %s", reason)
            return None
        return CpuLayerKernels(bf16_estimates=has_native_bf16(self.capabilities.isa))

    def create_communicator(self, ranks: Sequence[int] | None = None) -> Communicator | None:
        """Ranks that can map one shared-memory segment (all on this host) get a
        ``SharedMemoryCommunicator``: all-reduce, all-gather and reduce-scatter through the segment, the
        rest over the gloo communicator it wraps; otherwise (another host, no ``/dev/shm`` room, no C
        compiler, a group of one, ``TOKENMILL_CPU_SHARED_MEMORY_COMMUNICATOR=0``) that gloo communicator
        alone, with the reason logged. Every rank of the group gets the same kind."""
        base = super().create_communicator(ranks)
        if base is None or base.world_size == 1 or os.environ.get(SHARED_MEMORY_ENV, "1") == "0":
            return base
        from tokenmill_cpu.shared_memory_communicator import SharedMemoryCommunicator, SharedMemoryUnavailable

        try:
            return SharedMemoryCommunicator.attach(base)
        except SharedMemoryUnavailable as reason:
            logger.warning("cpu platform: collectives over %s only: %s", base.describe(), reason)
            return base

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """dtype from the ISA, a KV cache of a quarter of available RAM (at most 32 GiB) and
        one thread per physical core (unless OMP_NUM_THREADS is set)."""
        overrides: dict[str, Any] = {}
        if self.left_unset(config, "dtype"):
            overrides["dtype"] = self.capabilities.dtypes[0]
        if self.left_unset(config, "kv_cache_memory"):
            overrides["kv_cache_memory"] = min(int(self.memory_info().free * KV_CACHE_FRACTION), KV_CACHE_CAP)
        if self.left_unset(config, "num_threads") and not os.environ.get("OMP_NUM_THREADS"):
            overrides["num_threads"] = self.physical_cores
        return overrides

    def describe(self) -> str:
        """``cpu (model, N cores, ISA)``."""
        info = read_cpuinfo(self.cpuinfo_path)
        isa = ", ".join(self.capabilities.isa) or "baseline ISA"
        return f"cpu ({info.model_name or host.machine()}, {self.physical_cores} cores, {isa})"
