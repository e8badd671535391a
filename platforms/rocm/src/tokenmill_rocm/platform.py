"""The ROCm platform: AMD GPUs through the ROCm (HIP) build of PyTorch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from tokenmill.plugin_api import PlatformCapabilities, ProbeResult
from tokenmill.plugin_api.gpu_platform import TorchDevicePlatform
from tokenmill_rocm.capabilities import rocm_capabilities

VISIBILITY_VARIABLES = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


class RocmPlatform(TorchDevicePlatform):
    """AMD GPUs. Scores 100 when the ROCm build of torch sees at least one device.

    torch keeps the ``torch.cuda`` namespace and the ``"cuda"`` device type under ROCm, so this
    platform's tensors live on ``cuda:N`` and its collectives backend is called ``"nccl"`` (RCCL).
    """

    name = "rocm"
    device_type = "cuda"
    api_version = (2, 0)
    runtime_label = "ROCm"

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
        return ProbeResult(100, (f"ROCm (HIP {torch.version.hip}) with {count} device(s)",), cls.visible_devices(count))

    @classmethod
    def device_extra(cls, props: Any) -> Mapping[str, str]:
        """The ``gcnArchName`` (e.g. ``gfx942:sramecc+:xnack-``)."""
        return {"arch": props.gcnArchName}

    @cached_property
    def capabilities(self) -> PlatformCapabilities:
        """Derived from the active device's ``gcnArchName``."""
        import torch

        return rocm_capabilities(torch.cuda.get_device_properties(self.device_index).gcnArchName)

    def describe(self) -> str:
        """``rocm:N (device name, gfxNNN)``."""
        import torch

        props = torch.cuda.get_device_properties(self.device_index)
        return f"rocm:{self.device_index} ({props.name}, {props.gcnArchName.split(':')[0]})"
