"""PlatformConformance: a platform plugin checked against the ``Platform`` contract.

Subclass it in a test file::

    class TestMyPlatform(PlatformConformance):
        platform_cls = MyPlatform

The static checks (class attributes, API version, probe result and its freedom from side effects)
run everywhere. The checks that need the device (capabilities, ``torch_device``, memory, seeding,
config defaults) run when ``probe()`` says the platform is available here and are skipped with
the probe's reasons otherwise.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
import torch

from tokenmill.plugin_api import (
    DeviceInfo,
    Fp8Format,
    MemoryInfo,
    Platform,
    PlatformCapabilities,
    ProbeResult,
    QuantKernel,
    api_version_problem,
)
from tokenmill_testkit.side_effects import ProcessSnapshot

SAMPLE_CONFIG: Mapping[str, Any] = types.MappingProxyType({
    "model": "org/model",
    "dtype": "auto",
    "max_model_len": 2048,
    "gpu_memory_utilization": None,
    "kv_cache_memory": None,
    "num_threads": None,
})


class PlatformConformance:
    """Base class of a platform's conformance tests; set ``platform_cls``."""

    platform_cls: ClassVar[type[Platform]]
    allowed_probe_imports: ClassVar[tuple[str, ...]] = ()  # extra top-level packages probe() may import

    @pytest.fixture(scope="class")
    @classmethod
    def active_platform(cls) -> Platform:
        probe = cls.platform_cls.probe()
        if not probe.available:
            pytest.skip(f"{cls.platform_cls.name} is not available here: {'; '.join(probe.reasons)}")
        platform = cls.platform_cls(probe.devices[0].index if probe.devices else 0)
        platform.activate()
        return platform

    # -- static ---------------------------------------------------------------------------------

    def test_probe_has_no_side_effects(self) -> None:
        """First in the class on purpose: a probe that changes the process is only visible the
        first time it runs in a process (run this file on its own for a definitive answer)."""
        before = ProcessSnapshot.take()
        first = self.platform_cls.probe()
        second = self.platform_cls.probe()
        after = ProcessSnapshot.take()
        own = self.platform_cls.__module__.split(".", 1)[0]
        problems = before.violations(after, allowed_roots=(own, *self.allowed_probe_imports))
        assert not problems, f"{self.platform_cls.name}.probe() has side effects: " + "; ".join(problems)
        assert first.score == second.score, "probe() must give the same score when called twice"

    def test_class_attributes(self) -> None:
        cls = self.platform_cls
        assert issubclass(cls, Platform)
        assert isinstance(getattr(cls, "name", None), str) and cls.name.isidentifier(), \
            f"name must be a short identifier (what --device accepts), got {getattr(cls, 'name', None)!r}"
        assert isinstance(getattr(cls, "device_type", None), str) and cls.device_type, "device_type must be set"
        assert isinstance(cls.priority, int)

    def test_api_version_declared_and_compatible(self) -> None:
        """The class itself declares the plugin API it is built against, and this core loads it."""
        problem = api_version_problem(self.platform_cls)
        assert problem is None, f"{self.platform_cls.__qualname__} {problem}"

    def test_probe_returns_probe_result(self) -> None:
        result = self.platform_cls.probe()
        assert isinstance(result, ProbeResult), f"probe() returned {type(result).__name__}"
        assert isinstance(result.score, int) and result.score >= 0, result.score
        assert isinstance(result.reasons, tuple) and all(isinstance(r, str) and r for r in result.reasons)
        assert isinstance(result.devices, tuple) and all(isinstance(d, DeviceInfo) for d in result.devices)
        assert len({d.index for d in result.devices}) == len(result.devices), "device indices must be unique"
        if not result.available:
            assert result.reasons, "a score of 0 needs a reason the user can read"

    def test_attention_preference(self) -> None:
        preference = self.platform_cls().attention_preference()
        assert isinstance(preference, tuple) and preference, "attention_preference() must name at least one backend"
        assert all(isinstance(name, str) and name for name in preference)
        kernels = self.platform_cls().quant_kernel_preference()
        assert isinstance(kernels, tuple) and all(isinstance(name, str) for name in kernels)

    # -- on the device --------------------------------------------------------------------------

    def test_capabilities_well_formed(self, active_platform: Platform) -> None:
        caps = active_platform.capabilities
        assert isinstance(caps, PlatformCapabilities)
        assert caps.dtypes, "at least one compute dtype"
        for name in caps.dtypes:
            assert isinstance(getattr(torch, name, None), torch.dtype), f"{name!r} is not a torch dtype name"
        assert isinstance(caps.fp8_format, Fp8Format)
        assert not caps.fp8_compute or caps.fp8_format is not Fp8Format.NONE, "fp8_compute needs an fp8_format"
        for field in ("collectives", "families", "isa"):
            values = getattr(caps, field)
            assert isinstance(values, tuple) and all(isinstance(v, str) and v for v in values), (field, values)
        assert caps.collectives, "at least one collectives backend (gloo works everywhere)"
        assert active_platform.distributed_backend in caps.collectives

    def test_torch_device(self, active_platform: Platform) -> None:
        device = active_platform.torch_device()
        assert isinstance(device, torch.device) and device.type == self.platform_cls.device_type
        x = torch.arange(4, device=device, dtype=torch.float32)
        assert float((x * 2).sum().cpu()) == 12.0

    def test_memory_info(self, active_platform: Platform) -> None:
        info = active_platform.memory_info()
        assert isinstance(info, MemoryInfo)
        assert info.total > 0 and 0 <= info.free <= info.total, info

    def test_kv_cache_memory(self, active_platform: Platform) -> None:
        cache = active_platform.allocate_kv_cache((2, 6, 4, 2, 8), torch.float32)
        assert isinstance(cache, torch.Tensor) and cache.shape == (2, 6, 4, 2, 8) and cache.dtype == torch.float32
        assert cache.device.type == self.platform_cls.device_type and cache.is_contiguous()
        assert not bool(cache.any().cpu()), "allocate_kv_cache() must return zeros"
        cache[:, 1].fill_(3.0)
        backed = active_platform.back_kv_cache(cache, 1, 0, 4)
        assert isinstance(backed, bool)
        assert float(cache.sum().cpu()) == 3.0 * cache[:, 1].numel(), "back_kv_cache() must keep what blocks hold"

    def test_linear_kernels(self, active_platform: Platform) -> None:
        kernels = active_platform.linear_kernels()
        assert isinstance(kernels, tuple)
        for kernel in kernels:
            assert isinstance(kernel, type) and issubclass(kernel, QuantKernel), kernel
            assert isinstance(kernel.name, str) and kernel.name, f"{kernel!r} needs a name"
            assert kernel.plain_weight, f"{kernel.name}: linear_kernels() run plain float weights (plain_weight)"

    def test_seed_and_synchronize(self, active_platform: Platform) -> None:
        device = active_platform.torch_device()
        active_platform.seed(1234)
        first = torch.rand(8, device=device)
        active_platform.seed(1234)
        second = torch.rand(8, device=device)
        active_platform.synchronize()
        assert torch.equal(first.cpu(), second.cpu()), "seed() must make device random numbers repeatable"

    def test_config_defaults(self, active_platform: Platform) -> None:
        config = dict(SAMPLE_CONFIG)
        overrides = active_platform.config_defaults(types.MappingProxyType(config))
        assert isinstance(overrides, dict) and all(isinstance(k, str) for k in overrides), overrides
        assert config == dict(SAMPLE_CONFIG), "config_defaults() must not mutate its input"
        if "dtype" in overrides:
            assert overrides["dtype"] in active_platform.capabilities.dtypes
        pinned = {**SAMPLE_CONFIG, "dtype": "float32"}
        assert active_platform.config_defaults(types.MappingProxyType(pinned)).get("dtype", "float32") == "float32", \
            "a dtype the user chose must not be overridden"

    def test_describe(self, active_platform: Platform) -> None:
        line = active_platform.describe()
        assert isinstance(line, str) and line and "\n" not in line
