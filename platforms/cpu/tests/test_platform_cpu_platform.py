"""CpuPlatform: probe, defaults, memory and thread pinning, on fixture machines and on this one."""

from __future__ import annotations

import pytest
import torch

from tokenmill_cpu import platform as cpu_platform
from tokenmill_cpu.platform import KV_CACHE_CAP, CpuPlatform


@pytest.fixture
def machine(monkeypatch, write_proc, cpus):
    """Point the platform at fixture /proc files (2 sockets x 4 cores x 2 threads) and a fixed
    affinity mask."""
    fixtures = cpus

    def build(name: str, available_kb: int = 64 << 20, cpus: set[int] | None = None, model: str = "Fixture CPU"):
        text = fixtures.x86_cpuinfo(model, fixtures.flags[name], sockets=2, cores=4, threads=2)
        monkeypatch.setattr(CpuPlatform, "cpuinfo_path", write_proc("cpuinfo", text))
        meminfo = fixtures.meminfo.format(total=available_kb * 2, available=available_kb)
        monkeypatch.setattr(CpuPlatform, "meminfo_path", write_proc("meminfo", meminfo))
        monkeypatch.setattr(cpu_platform, "available_cpus", lambda: cpus if cpus is not None else set(range(16)))

    return build


def test_this_machine_scores_50_and_reports_its_isa():
    result = CpuPlatform.probe()
    assert result.score == 50
    assert "avx2" in result.devices[0].extra["isa"].split()
    assert any("avx2" in reason for reason in result.reasons)


def test_avx2_machine_defaults_to_float32(machine):
    machine("avx2-only")
    result = CpuPlatform.probe()
    assert result.score == 50
    assert result.reasons[0].endswith("16 logical CPUs on 8 physical cores available")
    assert result.reasons[1].startswith("ISA fma, avx2; torch kernels ")
    assert result.reasons[2] == "default dtype float32 (no native bf16 dot products)"
    assert result.devices[0].name == "Fixture CPU"
    assert result.devices[0].total_memory == (128 << 20) * 1024
    assert CpuPlatform(0).config_defaults({"dtype": "auto"})["dtype"] == "float32"


def test_amx_machine_defaults_to_bfloat16(machine):
    machine("amx")
    assert CpuPlatform.probe().reasons[2] == "default dtype bfloat16 (native bf16 dot products)"
    platform = CpuPlatform(0)
    assert platform.capabilities.dtypes[0] == "bfloat16" and "amx_bf16" in platform.capabilities.isa


def test_config_defaults(machine):
    machine("avx2-only", available_kb=16 << 20, cpus={0, 1, 8, 9})  # two cores with both hyper-threads
    overrides = CpuPlatform(0).config_defaults({"dtype": "auto", "kv_cache_memory": None})
    assert overrides == {"dtype": "float32", "kv_cache_memory": (16 << 30) // 4, "num_threads": 2}
    assert CpuPlatform(0).config_defaults({"dtype": "bfloat16", "kv_cache_memory": 1 << 30, "num_threads": 3}) == {}


def test_kv_cache_default_is_capped(machine):
    machine("avx2-only", available_kb=1 << 30)  # 1 TiB available
    assert CpuPlatform(0).config_defaults({})["kv_cache_memory"] == KV_CACHE_CAP


def test_memory_info_reads_mem_available(machine):
    machine("avx2-only", available_kb=10 << 20)
    info = CpuPlatform(0).memory_info()
    assert (info.total, info.free) == (20 << 30, 10 << 30)


def test_activate_pins_one_thread_per_physical_core(machine, monkeypatch):
    machine("avx2-only", cpus={0, 1, 2, 8, 9, 10})
    pinned = []
    monkeypatch.setattr(torch, "set_num_threads", pinned.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    CpuPlatform(0).activate()
    assert pinned == [3]


def test_activate_respects_omp_num_threads(machine, monkeypatch):
    machine("avx2-only")
    pinned = []
    monkeypatch.setattr(torch, "set_num_threads", pinned.append)
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    CpuPlatform(0).activate()
    assert pinned == []


def test_only_device_zero_exists():
    with pytest.raises(ValueError, match="single device"):
        CpuPlatform(1).activate()


def test_without_proc_files(monkeypatch, tmp_path):
    monkeypatch.setattr(CpuPlatform, "cpuinfo_path", str(tmp_path / "no-cpuinfo"))
    monkeypatch.setattr(CpuPlatform, "meminfo_path", str(tmp_path / "no-meminfo"))
    result = CpuPlatform.probe()
    assert result.score == 50 and result.reasons[1].startswith("ISA baseline")
    info = CpuPlatform(0).memory_info()
    assert info.total > 0 and 0 <= info.free <= info.total
    assert CpuPlatform(0).capabilities.dtypes == ("float32", "bfloat16")


def test_describe(machine):
    machine("amx", model="Intel(R) Xeon(R) Platinum 8480+", cpus={0, 1})
    assert CpuPlatform(0).describe().startswith("cpu (Intel(R) Xeon(R) Platinum 8480+, 2 cores, fma, avx2")
