"""The XPU platform: Intel GPUs through upstream ``torch.xpu`` (no Intel Extension required)."""

from __future__ import annotations

from functools import cached_property
from types import ModuleType

from tokenmill.plugin_api import PlatformCapabilities, ProbeResult
from tokenmill.plugin_api.gpu_platform import TorchDevicePlatform
from tokenmill_xpu import ipex
from tokenmill_xpu.capabilities import xpu_capabilities


class XpuPlatform(TorchDevicePlatform):
    """Intel GPUs. Scores 100 when ``torch.xpu`` sees at least one device."""

    name = "xpu"
    device_type = "xpu"
    api_version = (2, 0)
    runtime_label = "XPU"

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
        return ProbeResult(100, tuple(reasons), cls.visible_devices(count))

    def activate(self) -> None:
        """Select ``device_index`` (initialises the XPU runtime) and load a matching IPEX, if any."""
        import torch

        super().activate()
        self.ipex, self.ipex_note = ipex.load(torch.__version__)

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """Derived from the active device's properties."""
        import torch

        props = torch.xpu.get_device_properties(self.device_index)
        return xpu_capabilities(props, graph_capture=hasattr(torch.xpu, "XPUGraph"))

    def describe(self) -> str:
        """``xpu:N (device name)``, plus the IPEX note when there is one."""
        import torch

        line = f"xpu:{self.device_index} ({torch.xpu.get_device_name(self.device_index)})"
        return f"{line}; {self.ipex_note}" if self.ipex_note else line
