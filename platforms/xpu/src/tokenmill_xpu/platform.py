"""The XPU platform: Intel GPUs through upstream ``torch.xpu`` (no Intel Extension required)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from types import ModuleType
from typing import Any

from tokenmill.plugin_api import DeviceInfo, MemoryInfo, Platform, PlatformCapabilities, ProbeResult
from tokenmill_xpu import ipex
from tokenmill_xpu.capabilities import xpu_capabilities

GPU_MEMORY_UTILIZATION = 0.9


def _unset(config: Mapping[str, Any], key: str) -> bool:
    return config.get(key) in (None, "auto")


class XpuPlatform(Platform):
    """Intel GPUs. Scores 100 when ``torch.xpu`` sees at least one device."""

    name = "xpu"
    device_type = "xpu"
    api_version = (2, 0)

    def __init__(self, device_index: int = 0) -> None:
        super().__init__(device_index)
        self.ipex: ModuleType | None = None
        self.ipex_note: str | None = None

    @classmethod
    def probe(cls) -> ProbeResult:
        """Count devices with ``torch.xpu.device_count`` (Level Zero Sysman first, so no SYCL
        context); names and memory only when this process already initialised XPU. IPEX is
        looked up in package metadata, never imported."""
        import torch

        if getattr(torch.version, "xpu", None) is None or not hasattr(torch, "xpu"):
            return ProbeResult(0, (f"torch is built without XPU support ({torch.__version__})",))
        count = torch.xpu.device_count()
        if count == 0:
            return ProbeResult(0, ("no XPU device visible",))
        reasons = [f"XPU (SYCL {torch.version.xpu}) with {count} device(s)"]
        ipex_status = ipex.status(torch.__version__)
        if ipex_status:
            reasons.append(ipex_status)
        devices = tuple(_device_info(torch, index) for index in range(count))
        return ProbeResult(100, tuple(reasons), devices)

    def activate(self) -> None:
        """Select ``device_index`` (initialises the XPU runtime) and load a matching IPEX, if any."""
        import torch

        count = torch.xpu.device_count()
        if not 0 <= self.device_index < count:
            raise ValueError(f"XPU device {self.device_index} does not exist: {count} device(s) visible")
        torch.xpu.set_device(self.device_index)
        self.ipex, self.ipex_note = ipex.load(torch.__version__)

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """Derived from the active device's properties."""
        import torch

        props = torch.xpu.get_device_properties(self.device_index)
        return xpu_capabilities(props, graph_capture=hasattr(torch.xpu, "XPUGraph"))

    def memory_info(self) -> MemoryInfo:
        """Free and total memory of the active device."""
        import torch

        free, total = torch.xpu.mem_get_info(self.device_index)
        return MemoryInfo(total=total, free=free)

    def synchronize(self) -> None:
        """Wait for all queued work on the active device."""
        import torch

        torch.xpu.synchronize(self.device_index)

    def seed(self, seed: int) -> None:
        """Seed the CPU generator and the generators of every XPU device."""
        import torch

        torch.manual_seed(seed)
        torch.xpu.manual_seed_all(seed)

    def attention_preference(self) -> tuple[str, ...]:
        """Triton kernels first, then the plain-PyTorch reference."""
        return ("triton", "reference")

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The device's best dtype and 90% of device memory."""
        overrides: dict[str, Any] = {}
        if _unset(config, "dtype"):
            overrides["dtype"] = self.capabilities.dtypes[0]
        if _unset(config, "gpu_memory_utilization"):
            overrides["gpu_memory_utilization"] = GPU_MEMORY_UTILIZATION
        return overrides

    def describe(self) -> str:
        """``xpu:N (device name)``, plus the IPEX note when there is one."""
        import torch

        line = f"xpu:{self.device_index} ({torch.xpu.get_device_name(self.device_index)})"
        return f"{line}; {self.ipex_note}" if self.ipex_note else line


def _device_info(torch: Any, index: int) -> DeviceInfo:
    if not torch.xpu.is_initialized():
        return DeviceInfo(index=index, name=f"xpu:{index}")
    props = torch.xpu.get_device_properties(index)
    return DeviceInfo(index=index, name=props.name, total_memory=props.total_memory)
