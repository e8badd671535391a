"""TorchDevicePlatform: the base of platforms whose device PyTorch drives through its own device
module (``torch.get_device_module(device_type)``: ``torch.cuda`` for CUDA and ROCm, ``torch.xpu``).

Such a module answers the same questions for every vendor (``device_count``, ``is_initialized``,
``get_device_properties``, ``set_device``, ``mem_get_info``, ``synchronize``, ``manual_seed_all``),
so a subclass writes only what differs: ``probe`` (which build of torch, which devices) and
``capabilities``, plus any optional member it wants to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tokenmill.plugin_api.platform import DeviceInfo, MemoryInfo, Platform


class TorchDevicePlatform(Platform):
    """A GPU platform on a torch device module. Subclasses set ``name``, ``device_type`` (which names
    the module) and ``runtime_label``, and implement ``probe`` and ``capabilities``."""

    runtime_label: ClassVar[str]
    """How messages name the devices' runtime ("CUDA", "ROCm", "XPU"). Required."""

    gpu_memory_utilization: ClassVar[float] = 0.9
    """The share of device memory ``config_defaults`` proposes when the user set none."""

    @classmethod
    def device_module(cls) -> Any:
        """The torch device module of ``device_type`` (e.g. ``torch.cuda``); importing torch and
        looking the module up initialises no device."""
        import torch

        return torch.get_device_module(cls.device_type)

    @classmethod
    def device_info(cls, index: int) -> DeviceInfo:
        """What a probe reports about device ``index`` without initialising the runtime: only
        ``<name>:<index>`` until this process initialised it, then the device's name, memory and
        ``device_extra``."""
        module = cls.device_module()
        if not module.is_initialized():
            return DeviceInfo(index=index, name=f"{cls.name}:{index}")
        props = module.get_device_properties(index)
        return DeviceInfo(index=index, name=props.name, total_memory=props.total_memory, extra=cls.device_extra(props))

    @classmethod
    def device_extra(cls, props: Any) -> Mapping[str, str]:
        """Vendor details for ``DeviceInfo.extra`` from the device properties ``props``. Optional
        (default none)."""
        return {}

    @classmethod
    def visible_devices(cls, count: int) -> tuple[DeviceInfo, ...]:
        """``device_info`` of the first ``count`` devices, for ``ProbeResult.devices``."""
        return tuple(cls.device_info(index) for index in range(count))

    def activate(self) -> None:
        """Make ``device_index`` the current device (this initialises the runtime); ``ValueError``
        when no such device is visible."""
        module = self.device_module()
        count = module.device_count()
        if not 0 <= self.device_index < count:
            raise ValueError(f"{self.runtime_label} device {self.device_index} does not exist: {count} device(s) visible")
        module.set_device(self.device_index)

    def memory_info(self) -> MemoryInfo:
        """Free and total memory of the active device, as the runtime reports them."""
        free, total = self.device_module().mem_get_info(self.device_index)
        return MemoryInfo(total=total, free=free)

    def synchronize(self) -> None:
        """Wait for all queued work on the active device."""
        self.device_module().synchronize(self.device_index)

    def seed(self, seed: int) -> None:
        """Seed the CPU generator and the generators of every device of this runtime."""
        import torch

        torch.manual_seed(seed)
        self.device_module().manual_seed_all(seed)

    def attention_preference(self) -> tuple[str, ...]:
        """Triton kernels first, then the plain-PyTorch reference."""
        return ("triton", "reference")

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """For fields left unset (None or "auto"): the device's best dtype (``capabilities.dtypes[0]``)
        and ``gpu_memory_utilization`` of device memory."""
        overrides: dict[str, Any] = {}
        if self.left_unset(config, "dtype"):
            overrides["dtype"] = self.capabilities.dtypes[0]
        if self.left_unset(config, "gpu_memory_utilization"):
            overrides["gpu_memory_utilization"] = self.gpu_memory_utilization
        return overrides
