"""The ROCm platform: AMD GPUs through the ROCm (HIP) build of PyTorch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from tokenmill.plugin_api import DeviceInfo, MemoryInfo, Platform, PlatformCapabilities, ProbeResult
from tokenmill_rocm.capabilities import rocm_capabilities

GPU_MEMORY_UTILIZATION = 0.9
VISIBILITY_VARIABLES = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _unset(config: Mapping[str, Any], key: str) -> bool:
    return config.get(key) in (None, "auto")


class RocmPlatform(Platform):
    """AMD GPUs. Scores 100 when the ROCm build of torch sees at least one device.

    torch keeps the ``torch.cuda`` namespace and the ``"cuda"`` device type under ROCm, so this
    platform's tensors live on ``cuda:N`` and its collectives backend is called ``"nccl"`` (RCCL).
    """

    name = "rocm"
    device_type = "cuda"
    api_version = (2, 0)

    @classmethod
    def probe(cls) -> ProbeResult:
        """Count devices without initialising HIP (``device_count`` asks amdsmi first when it is
        installed). Names and memory are reported only when this process already initialised HIP."""
        import torch

        if torch.version.hip is None:
            if torch.version.cuda is not None:
                return ProbeResult(0, (f"torch built for CUDA {torch.version.cuda}, not ROCm; install tokenmill-cuda",))
            return ProbeResult(0, (f"torch is a CPU build ({torch.__version__})",))
        count = torch.cuda.device_count()
        if count == 0:
            hints = ", ".join(f"{var}={os.environ[var]!r}" for var in VISIBILITY_VARIABLES if var in os.environ)
            return ProbeResult(0, ("no ROCm GPU visible" + (f" ({hints})" if hints else ""),))
        devices = tuple(_device_info(torch, index) for index in range(count))
        return ProbeResult(100, (f"ROCm (HIP {torch.version.hip}) with {count} device(s)",), devices)

    def activate(self) -> None:
        """Make ``device_index`` the current device (this initialises the HIP runtime)."""
        import torch

        count = torch.cuda.device_count()
        if not 0 <= self.device_index < count:
            raise ValueError(f"ROCm device {self.device_index} does not exist: {count} device(s) visible")
        torch.cuda.set_device(self.device_index)

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """Derived from the active device's ``gcnArchName``."""
        import torch

        return rocm_capabilities(torch.cuda.get_device_properties(self.device_index).gcnArchName)

    def memory_info(self) -> MemoryInfo:
        """Free and total memory of the active device, from ``hipMemGetInfo``."""
        import torch

        free, total = torch.cuda.mem_get_info(self.device_index)
        return MemoryInfo(total=total, free=free)

    def synchronize(self) -> None:
        """Wait for all queued work on the active device."""
        import torch

        torch.cuda.synchronize(self.device_index)

    def seed(self, seed: int) -> None:
        """Seed the CPU generator and the generators of every GPU."""
        import torch

        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def attention_preference(self) -> tuple[str, ...]:
        """Triton kernels first, then the plain-PyTorch reference."""
        return ("triton", "reference")

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """bfloat16 on GPUs with matrix cores (else float16) and 90% of device memory."""
        overrides: dict[str, Any] = {}
        if _unset(config, "dtype"):
            overrides["dtype"] = self.capabilities.dtypes[0]
        if _unset(config, "gpu_memory_utilization"):
            overrides["gpu_memory_utilization"] = GPU_MEMORY_UTILIZATION
        return overrides

    def describe(self) -> str:
        """``rocm:N (device name, gfxNNN)``."""
        import torch

        props = torch.cuda.get_device_properties(self.device_index)
        return f"rocm:{self.device_index} ({props.name}, {props.gcnArchName.split(':')[0]})"


def _device_info(torch: Any, index: int) -> DeviceInfo:
    if not torch.cuda.is_initialized():
        return DeviceInfo(index=index, name=f"rocm:{index}")
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(index=index, name=props.name, total_memory=props.total_memory, extra={"arch": props.gcnArchName})
