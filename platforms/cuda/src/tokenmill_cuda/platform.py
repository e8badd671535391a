"""The CUDA platform: NVIDIA GPUs through the CUDA build of PyTorch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from tokenmill.plugin_api import PlatformCapabilities, ProbeResult
from tokenmill.plugin_api.gpu_platform import TorchDevicePlatform
from tokenmill_cuda.capabilities import cuda_capabilities
from tokenmill_cuda.cuda_graph import CudaDecodeGraph


class CudaPlatform(TorchDevicePlatform):
    """NVIDIA GPUs. Scores 100 when the CUDA build of torch sees at least one device."""

    name = "cuda"
    device_type = "cuda"
    api_version = (2, 0)
    runtime_label = "CUDA"
    _graph_pool: Any = None  # the memory pool every graph of this instance shares, made with the first

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
        return ProbeResult(100, (f"CUDA {torch.version.cuda} with {count} device(s)",), cls.visible_devices(count))

    @classmethod
    def device_extra(cls, props: Any) -> Mapping[str, str]:
        """The compute capability, ``major.minor``."""
        return {"compute_capability": f"{props.major}.{props.minor}"}

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """Derived from the active device's compute capability."""
        import torch

        return cuda_capabilities(torch.cuda.get_device_capability(self.device_index))

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

    def describe(self) -> str:
        """``cuda:N (device name, smXY)``."""
        import torch

        major, minor = torch.cuda.get_device_capability(self.device_index)
        return f"cuda:{self.device_index} ({torch.cuda.get_device_name(self.device_index)}, sm{major}{minor})"
