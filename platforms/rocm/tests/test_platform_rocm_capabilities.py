"""fp8 encodings, dtypes and defaults of RocmPlatform per GPU architecture."""

from __future__ import annotations

import pytest

from tokenmill.plugin_api import Fp8Format
from tokenmill_rocm.capabilities import base_arch, rocm_capabilities
from tokenmill_rocm.platform import RocmPlatform


@pytest.mark.parametrize(
    ("arch", "fp8", "first_dtype"),
    [
        ("gfx942:sramecc+:xnack-", Fp8Format.FNUZ, "bfloat16"),  # MI300X
        ("gfx940", Fp8Format.FNUZ, "bfloat16"),  # MI300A engineering
        ("gfx950:sramecc+:xnack-", Fp8Format.OCP, "bfloat16"),  # MI350
        ("gfx1201", Fp8Format.OCP, "bfloat16"),  # RDNA4
        ("gfx90a:sramecc+:xnack-", Fp8Format.NONE, "bfloat16"),  # MI250
        ("gfx1100", Fp8Format.NONE, "bfloat16"),  # RDNA3
        ("gfx906", Fp8Format.NONE, "float16"),  # MI50: no matrix cores
    ],
)
def test_fp8_encoding_and_dtypes_by_architecture(arch, fp8, first_dtype):
    caps = rocm_capabilities(arch)
    assert caps.fp8_format is fp8 and caps.fp8_compute == (fp8 is not Fp8Format.NONE)
    assert caps.dtypes[0] == first_dtype and caps.int8_dot == (first_dtype == "bfloat16")
    assert caps.families == ("rocm", "triton") and caps.collectives == ("nccl", "gloo")


def test_base_arch_strips_target_features():
    assert base_arch("gfx942:sramecc+:xnack-") == "gfx942"


def test_mi300_platform_end_to_end(simulated_rocm):
    simulated_rocm.devices(2)
    platform = RocmPlatform(1)
    platform.activate()
    assert ("set_device", 1) in simulated_rocm.calls
    assert platform.capabilities.fp8_format is Fp8Format.FNUZ
    assert platform.distributed_backend == "nccl"  # RCCL, under torch's name for it
    assert platform.torch_device().type == "cuda"
    assert platform.describe() == "rocm:1 (AMD Instinct MI300X, gfx942)"
    assert platform.config_defaults({"dtype": "auto"}) == {"dtype": "bfloat16", "gpu_memory_utilization": 0.9}
    info = platform.memory_info()
    assert (info.total, info.free) == (192 << 30, 190 << 30)
    platform.seed(3)
    platform.synchronize()
    assert ("manual_seed_all", 3) in simulated_rocm.calls and ("synchronize", 1) in simulated_rocm.calls


def test_mi350_uses_ocp_fp8(simulated_rocm):
    simulated_rocm.devices(1, arch="gfx950:sramecc+:xnack-", name="AMD Instinct MI355X")
    platform = RocmPlatform(0)
    platform.activate()
    assert platform.capabilities.fp8_format is Fp8Format.OCP


def test_activate_rejects_a_missing_device(simulated_rocm):
    simulated_rocm.devices(1)
    with pytest.raises(ValueError, match="ROCm device 2 does not exist"):
        RocmPlatform(2).activate()
