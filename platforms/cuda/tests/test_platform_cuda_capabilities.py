"""Capabilities, memory, seeding and defaults of CudaPlatform on simulated GPUs."""

from __future__ import annotations

import pytest

from tokenmill.plugin_api import Fp8Format
from tokenmill_cuda.capabilities import cuda_capabilities
from tokenmill_cuda.platform import CudaPlatform


@pytest.mark.parametrize(
    ("cc", "first_dtype", "fp8", "int8", "int4"),
    [
        ((7, 5), "float16", Fp8Format.NONE, True, True),  # T4
        ((8, 0), "bfloat16", Fp8Format.NONE, True, True),  # A100
        ((8, 9), "bfloat16", Fp8Format.OCP, True, True),  # L4 / RTX 4090
        ((9, 0), "bfloat16", Fp8Format.OCP, True, False),  # H100
        ((10, 0), "bfloat16", Fp8Format.OCP, True, False),  # B200
    ],
)
def test_capabilities_follow_compute_capability(cc, first_dtype, fp8, int8, int4):
    caps = cuda_capabilities(cc)
    assert caps.dtypes[0] == first_dtype and "float16" in caps.dtypes and "float32" in caps.dtypes
    assert ("bfloat16" in caps.dtypes) == (cc >= (8, 0))
    assert caps.fp8_format is fp8 and caps.fp8_compute == (fp8 is Fp8Format.OCP)
    assert (caps.int8_dot, caps.int4_dot) == (int8, int4)
    assert caps.graph_capture and caps.pinned_memory and not caps.unified_memory
    assert caps.collectives == ("nccl", "gloo")
    assert caps.families == ("cuda-compatible", "triton")


def test_activate_selects_the_device(simulated_cuda):
    simulated_cuda.devices(2)
    platform = CudaPlatform(1)
    platform.activate()
    assert ("set_device", 1) in simulated_cuda.calls
    assert platform.describe() == "cuda:1 (NVIDIA H100 80GB HBM3, sm90)"


def test_activate_rejects_a_missing_device(simulated_cuda):
    simulated_cuda.devices(1)
    with pytest.raises(ValueError, match="CUDA device 3 does not exist: 1 device"):
        CudaPlatform(3).activate()


def test_memory_seed_synchronize_and_backend(simulated_cuda):
    simulated_cuda.devices(1, total=80 << 30, free=70 << 30)
    platform = CudaPlatform(0)
    info = platform.memory_info()
    assert (info.total, info.free) == (80 << 30, 70 << 30)
    platform.seed(7)
    platform.synchronize()
    assert ("manual_seed_all", 7) in simulated_cuda.calls and ("synchronize", 0) in simulated_cuda.calls
    assert platform.distributed_backend == "nccl"
    assert platform.attention_preference() == ("flash_attn", "flashinfer", "triton", "reference")


@pytest.mark.parametrize(("cc", "dtype"), [((7, 5), "float16"), ((8, 6), "bfloat16"), ((9, 0), "bfloat16")])
def test_config_defaults_pick_the_dtype_for_auto(simulated_cuda, cc, dtype):
    simulated_cuda.devices(1, cc=cc)
    config = {"dtype": "auto", "gpu_memory_utilization": None}
    assert CudaPlatform(0).config_defaults(config) == {"dtype": dtype, "gpu_memory_utilization": 0.9}
    assert config == {"dtype": "auto", "gpu_memory_utilization": None}


def test_config_defaults_keep_user_choices(simulated_cuda):
    simulated_cuda.devices(1)
    assert CudaPlatform(0).config_defaults({"dtype": "float16", "gpu_memory_utilization": 0.5}) == {}
