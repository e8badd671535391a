"""MetalPlatform on simulated Macs and on this machine."""

from __future__ import annotations

import sys

import pytest

from tokenmill_metal.platform import MetalPlatform


def test_this_machine():
    result = MetalPlatform.probe()
    if sys.platform != "darwin":
        assert result.score == 0 and result.reasons == (f"Metal needs macOS (this is {sys.platform})",)


def test_torch_without_mps_scores_zero(simulated_mac):
    simulated_mac.build(built=False)
    assert MetalPlatform.probe().reasons[0].startswith("torch is built without MPS support")


def test_mps_unavailable_scores_zero(simulated_mac):
    simulated_mac.build(available=False)
    result = MetalPlatform.probe()
    assert result.score == 0 and "MPS is not available" in result.reasons[0]


def test_apple_gpu_scores_100(simulated_mac):
    simulated_mac.build()
    result = MetalPlatform.probe()
    assert result.score == 100
    assert result.reasons == ("Apple GPU through MPS on macOS 15.1 (unified memory)",)
    assert [(d.index, d.name) for d in result.devices] == [(0, "Apple M3 Max")]


@pytest.mark.parametrize(("macos", "dtypes"), [(13, ("float16", "float32")), (14, ("float16", "bfloat16", "float32"))])
def test_bfloat16_needs_macos_14(simulated_mac, macos, dtypes):
    simulated_mac.build(macos_version=macos)
    caps = MetalPlatform(0).capabilities
    assert caps.dtypes == dtypes
    assert caps.unified_memory and not caps.graph_capture and caps.collectives == ("gloo",)


def test_activated_platform(simulated_mac):
    simulated_mac.build()
    platform = MetalPlatform(0)
    platform.activate()
    info = platform.memory_info()
    assert (info.total, info.free) == (48 << 30, 42 << 30)
    assert platform.attention_preference() == ("reference",)
    assert platform.distributed_backend == "gloo"
    assert platform.config_defaults({"dtype": "auto"}) == {"dtype": "float16"}
    assert platform.config_defaults({"dtype": "bfloat16"}) == {}
    platform.seed(9)
    platform.synchronize()
    assert ("manual_seed", 9) in simulated_mac.calls and simulated_mac.calls[-1] == ("synchronize",)
    assert platform.describe() == "mps:0 (Apple M3 Max)"
    assert str(platform.torch_device()) == "mps:0"


def test_only_device_zero_exists(simulated_mac):
    simulated_mac.build()
    with pytest.raises(ValueError, match="single device"):
        MetalPlatform(1).activate()
