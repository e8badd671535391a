"""/proc/cpuinfo and /proc/meminfo texts of machines other than this one, and the kernels built for
other x86-64 targets (so an AVX-512 host also runs the AVX2 code an AVX2 CPU gets)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

BASE_X86 = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
            "syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes "
            "xsave avx f16c rdrand lahf_lm abm bmi1 avx2 bmi2 erms")
AVX2_ONLY = BASE_X86  # Haswell .. Alder Lake E-cores
AVX512_BF16 = BASE_X86 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16"  # Cooper Lake, Zen 4
AMX = AVX512_BF16 + " avx_vnni avx512_fp16 amx_bf16 amx_tile amx_int8"  # Sapphire Rapids
NEOVERSE_V1 = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
               "dcpop sha3 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm "
               "svebf16 i8mm bf16 dgh rng")


def x86_cpuinfo(model: str, flags: str, sockets: int = 2, cores: int = 2, threads: int = 2) -> str:
    """Linux numbers SMT siblings last: cpu N and N + sockets*cores share a core."""
    blocks = []
    per_thread = sockets * cores
    for cpu in range(per_thread * threads):
        core = cpu % per_thread
        blocks.append(f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\n"
                      f"physical id\t: {core // cores}\ncore id\t\t: {core % cores}\nflags\t\t: {flags}\n")
    return "\n".join(blocks)


def arm_cpuinfo(cpus: int = 4) -> str:
    return "\n".join(f"processor\t: {cpu}\nBogoMIPS\t: 2100.00\nFeatures\t: {NEOVERSE_V1}\n"
                     f"CPU implementer\t: 0x41\nCPU part\t: 0xd40\n" for cpu in range(cpus))


MEMINFO = "MemTotal:       {total} kB\nMemFree:         1000000 kB\nMemAvailable:   {available} kB\nBuffers: 1 kB\n"


FLAGS = {"avx2-only": AVX2_ONLY, "avx512-bf16": AVX512_BF16, "amx": AMX}


@pytest.fixture
def cpus():
    """The fixture machines: flags by name and cpuinfo text builders."""
    return SimpleNamespace(flags=FLAGS, x86_cpuinfo=x86_cpuinfo, arm_cpuinfo=arm_cpuinfo, meminfo=MEMINFO)


@pytest.fixture
def write_proc(tmp_path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def build_for_march(tmp_path):
    """``build(source, march, like)``: ``source`` compiled for ``-march=march`` without AVX-512 (haswell:
    AVX2 + FMA; x86-64: the portable code), its functions typed as those of ``like`` (the loaded
    native build of the same source). Skipped off x86-64, without AVX2 or without a C compiler."""
    from tokenmill.plugin_api.native import FLAGS, compiler
    from tokenmill_cpu.cpuinfo import read_cpuinfo

    if platform.machine() != "x86_64" or "avx2" not in read_cpuinfo().flags:
        pytest.skip("x86-64 builds, run on an AVX2 CPU")
    cc = compiler()
    if cc is None:
        pytest.skip("no C compiler")

    def build(source: Path, march: str, like: ctypes.CDLL) -> ctypes.CDLL:
        built = tmp_path / f"{source.stem}_{march}.so"
        flags = [f for f in FLAGS if not f.startswith("-march")] + [f"-march={march}", "-mno-avx512f"]
        subprocess.run([cc, *flags, str(source), "-o", str(built), "-lm"], check=True, capture_output=True)
        library = ctypes.CDLL(str(built))
        for name in dir(like):
            if not name.startswith("_") and hasattr(library, name):
                function, typed = getattr(library, name), getattr(like, name)
                function.argtypes, function.restype = typed.argtypes, typed.restype
        return library

    return build
