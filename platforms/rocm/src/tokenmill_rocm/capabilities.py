"""What an AMD GPU computes well, derived from its GCN architecture name (e.g. ``gfx942``)."""

from __future__ import annotations

from tokenmill.plugin_api import Fp8Format, PlatformCapabilities

# MI300 (gfx940/941/942) computes in the FNUZ fp8 encoding; MI350 (gfx950) and RDNA4 (gfx12xx)
# switched to the OCP encoding. Kernels must not mix the two: the bit patterns differ.
FNUZ_FP8_ARCHS = ("gfx940", "gfx941", "gfx942")
OCP_FP8_PREFIXES = ("gfx950", "gfx12")
# Matrix cores with bf16 and int8 inputs: CDNA1-4 (MFMA) and RDNA3/4 (WMMA).
MATRIX_CORE_PREFIXES = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def base_arch(gcn_arch_name: str) -> str:
    """``"gfx942:sramecc+:xnack-"`` -> ``"gfx942"``."""
    return gcn_arch_name.split(":", 1)[0].strip().lower()


def fp8_format(gcn_arch_name: str) -> Fp8Format:
    """The fp8 encoding the matrix cores of ``gcn_arch_name`` compute in."""
    arch = base_arch(gcn_arch_name)
    if arch in FNUZ_FP8_ARCHS:
        return Fp8Format.FNUZ
    if arch.startswith(OCP_FP8_PREFIXES):
        return Fp8Format.OCP
    return Fp8Format.NONE


def rocm_capabilities(gcn_arch_name: str) -> PlatformCapabilities:
    """Capabilities of a GPU whose ``gcnArchName`` is ``gcn_arch_name``.

    ``collectives`` lists torch.distributed backend names: under ROCm torch exposes RCCL as
    ``"nccl"``, so that is what ``init_process_group`` needs.
    """
    arch = base_arch(gcn_arch_name)
    fp8 = fp8_format(arch)
    matrix_cores = arch.startswith(MATRIX_CORE_PREFIXES)
    return PlatformCapabilities(
        dtypes=("bfloat16", "float16", "float32") if matrix_cores else ("float16", "float32"),
        fp8_format=fp8,
        fp8_compute=fp8 is not Fp8Format.NONE,
        int8_dot=matrix_cores,
        int4_dot=False,
        graph_capture=True,
        pinned_memory=True,
        unified_memory=False,
        collectives=("nccl", "gloo"),
        families=("rocm", "triton"),
    )
