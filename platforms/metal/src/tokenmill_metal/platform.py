"""The Metal platform: Apple silicon GPUs through PyTorch's MPS backend (macOS only)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from functools import cached_property
from platform import mac_ver
from typing import Any

from tokenmill.plugin_api import DeviceInfo, MemoryInfo, Platform, PlatformCapabilities, ProbeResult
from tokenmill_metal.capabilities import metal_capabilities


def running_on_macos() -> bool:
    return sys.platform == "darwin"


class MetalPlatform(Platform):
    """Apple GPUs. Scores 100 on macOS when torch is built with MPS and MPS is available."""

    name = "metal"
    device_type = "mps"
    api_version = (2, 0)

    @classmethod
    def probe(cls) -> ProbeResult:
        """Ask ``torch.backends.mps`` whether it is built and available; there is one device."""
        if not running_on_macos():
            return ProbeResult(0, (f"Metal needs macOS (this is {sys.platform})",))
        import torch

        if not torch.backends.mps.is_built():
            return ProbeResult(0, (f"torch is built without MPS support ({torch.__version__})",))
        if not torch.backends.mps.is_available():
            return ProbeResult(0, ("MPS is not available (needs Apple silicon and macOS 12.3 or newer)",))
        get_name = getattr(torch.backends.mps, "get_name", None)
        device = DeviceInfo(index=0, name=get_name() if get_name else "mps")
        macos = mac_ver()[0] or "unknown version"
        return ProbeResult(100, (f"Apple GPU through MPS on macOS {macos} (unified memory)",), (device,))

    def activate(self) -> None:
        """MPS has exactly one device; anything else is a user error."""
        if self.device_index != 0:
            raise ValueError(f"Metal has a single device (mps:0), not mps:{self.device_index}")

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """bfloat16 on macOS 14 or newer; float16 always."""
        import torch

        return metal_capabilities(torch.backends.mps.is_macos_or_newer(14, 0))

    def memory_info(self) -> MemoryInfo:
        """Metal's recommended working-set size as the total, minus what the driver has allocated.
        Falls back to host RAM on torch versions without those queries."""
        import torch

        if not hasattr(torch.mps, "recommended_max_memory"):
            return super().memory_info()
        total = torch.mps.recommended_max_memory()
        return MemoryInfo(total=total, free=max(0, total - torch.mps.driver_allocated_memory()))

    def synchronize(self) -> None:
        """Wait for queued Metal command buffers."""
        import torch

        torch.mps.synchronize()

    def seed(self, seed: int) -> None:
        """Seed the CPU generator and the MPS generator."""
        import torch

        torch.manual_seed(seed)
        torch.mps.manual_seed(seed)

    def attention_preference(self) -> tuple[str, ...]:
        """The plain-PyTorch reference backend, which runs on MPS through SDPA."""
        return ("reference",)

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """float16 when the user left dtype on auto."""
        if self.left_unset(config, "dtype"):
            return {"dtype": self.capabilities.dtypes[0]}
        return {}

    def describe(self) -> str:
        """``mps:0 (Apple GPU)``."""
        import torch

        get_name = getattr(torch.backends.mps, "get_name", None)
        return f"mps:0 ({get_name() if get_name else 'Apple GPU'})"
