"""Parsing /proc/cpuinfo and deriving ISA features and capabilities from it."""

from __future__ import annotations

import pytest

from tokenmill_cpu.capabilities import cpu_capabilities
from tokenmill_cpu.cpuinfo import CpuInfo, parse_cpuinfo, read_cpuinfo
from tokenmill_cpu.isa import isa_features


def test_parse_model_flags_and_topology(cpus):
    text = cpus.x86_cpuinfo("Intel(R) Xeon(R) CPU E5-2680 v3", cpus.flags["avx2-only"], sockets=2, cores=2, threads=2)
    info = parse_cpuinfo(text)
    assert info.model_name == "Intel(R) Xeon(R) CPU E5-2680 v3"
    assert "avx2" in info.flags and "avx512f" not in info.flags
    assert info.core_of[0] == info.core_of[4] == ("0", "0")  # SMT siblings
    assert info.physical_cores(range(8)) == 4
    assert info.physical_cores({0, 4}) == 1
    assert info.physical_cores({0, 1, 2}) == 3


def test_arm_features_line_without_topology(cpus):
    info = parse_cpuinfo(cpus.arm_cpuinfo(4))
    assert {"i8mm", "bf16", "sve", "asimddp"} <= info.flags
    assert info.model_name == "" and info.physical_cores({0, 1, 2, 3}) == 4


def test_missing_file_is_an_empty_cpu(tmp_path):
    assert read_cpuinfo(str(tmp_path / "absent")) == CpuInfo()


@pytest.mark.parametrize(
    ("machine", "dtypes", "int8", "isa"),
    [
        ("avx2-only", ("float32", "bfloat16"), False, ("fma", "avx2")),
        ("avx512-bf16", ("bfloat16", "float32"), True, ("fma", "avx2", "avx512f", "avx512_vnni", "avx512_bf16")),
        ("amx", ("bfloat16", "float32", "float16"), True,
         ("fma", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "avx512_fp16", "amx_tile", "amx_bf16",
          "amx_int8")),
    ],
)
def test_x86_capabilities(cpus, machine, dtypes, int8, isa):
    caps = cpu_capabilities(isa_features(cpus.flags[machine].split()))
    assert caps.dtypes == dtypes and caps.int8_dot == int8 and caps.isa == isa
    assert caps.collectives == ("gloo",) and caps.graph_capture and caps.unified_memory


def test_arm_with_bf16_and_i8mm(cpus):
    caps = cpu_capabilities(isa_features(parse_cpuinfo(cpus.arm_cpuinfo()).flags))
    assert caps.dtypes == ("bfloat16", "float32", "float16") and caps.int8_dot
    assert caps.isa == ("asimdhp", "asimddp", "i8mm", "bf16", "sve")
