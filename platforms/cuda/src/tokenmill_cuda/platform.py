"""The CUDA platform: NVIDIA GPUs through the CUDA build of PyTorch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from tokenmill.plugin_api import DeviceInfo, MemoryInfo, Platform, PlatformCapabilities, ProbeResult
from tokenmill_cuda.capabilities import cuda_capabilities
from tokenmill_cuda.cuda_graph import CudaDecodeGraph

GPU_MEMORY_UTILIZATION = 0.9


def _unset(config: Mapping[str, Any], key: str) -> bool:
    return config.get(key) in (None, "auto")


class CudaPlatform(Platform):
    """NVIDIA GPUs. Scores 100 when the CUDA build of torch sees at least one device."""

    name = "cuda"
    device_type = "cuda"
    api_version = (2, 0)

    def __init__(self, device_index: int = 0) -> None:
        super().__init__(device_index)
        self._graph_pool: Any = None

    @classmethod
    def probe(cls) -> ProbeResult:
        """Count devices without initialising CUDA.

        ``torch.cuda.device_count()`` asks NVML first (no CUDA context, no fork poisoning) and only
        falls back to ``cudaGetDeviceCount`` when NVML is missing. ``get_device_properties`` would
        initialise the runtime, so device names and memory are reported only when this process has
        already initialised CUDA; otherwise each device is listed by index alone.
        """
        import torch

        if torch.version.hip is not None:
            return ProbeResult(0, (f"torch built for ROCm (HIP {torch.version.hip}); install tokenmill-rocm",))
        if torch.version.cuda is None:
            return ProbeResult(0, (f"torch is a CPU build ({torch.__version__})",))
        count = torch.cuda.device_count()
        if count == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return ProbeResult(0, (f"no CUDA device visible{hint}",))
        devices = tuple(_device_info(torch, index) for index in range(count))
        return ProbeResult(100, (f"CUDA {torch.version.cuda} with {count} device(s)",), devices)

    def activate(self) -> None:
        """Make ``device_index`` the current CUDA device (this initialises the CUDA runtime)."""
        import torch

        count = torch.cuda.device_count()
        if not 0 <= self.device_index < count:
            raise ValueError(f"CUDA device {self.device_index} does not exist: {count} device(s) visible")
        torch.cuda.set_device(self.device_index)

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """Derived from the active device's compute capability."""
        import torch

        return cuda_capabilities(torch.cuda.get_device_capability(self.device_index))

    def memory_info(self) -> MemoryInfo:
        """Free and total memory of the active device, from ``cudaMemGetInfo``."""
        import torch

        free, total = torch.cuda.mem_get_info(self.device_index)
        return MemoryInfo(total=total, free=free)

    def synchronize(self) -> None:
        """Wait for all queued work on the active device."""
        import torch

        torch.cuda.synchronize(self.device_index)

    def seed(self, seed: int) -> None:
        """Seed the CPU generator and the generators of every CUDA device."""
        import torch

        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def create_graph(self) -> CudaDecodeGraph:
        """A new, empty CUDA graph for one decode batch size (the DecodeGraph
        contract of ``tokenmill.plugin_api.graphs``). Every graph of this platform shares one memory pool."""
        import torch

        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        return CudaDecodeGraph(self.torch_device(), self._graph_pool)

    def attention_preference(self) -> tuple[str, ...]:
        """Fastest kernels first; names that are not installed are rejected with a reason."""
        return ("flash_attn", "flashinfer", "triton", "reference")

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """bfloat16 where the GPU has bf16 tensor cores (else float16) and 90% of memory."""
        overrides: dict[str, Any] = {}
        if _unset(config, "dtype"):
            overrides["dtype"] = self.capabilities.dtypes[0]
        if _unset(config, "gpu_memory_utilization"):
            overrides["gpu_memory_utilization"] = GPU_MEMORY_UTILIZATION
        return overrides

    def describe(self) -> str:
        """``cuda:N (device name, smXY)``."""
        import torch

        major, minor = torch.cuda.get_device_capability(self.device_index)
        return f"cuda:{self.device_index} ({torch.cuda.get_device_name(self.device_index)}, sm{major}{minor})"


def _device_info(torch: Any, index: int) -> DeviceInfo:
    if not torch.cuda.is_initialized():
        return DeviceInfo(index=index, name=f"cuda:{index}")
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        index=index,
        name=props.name,
        total_memory=props.total_memory,
        extra={"compute_capability": f"{props.major}.{props.minor}"},
    )
