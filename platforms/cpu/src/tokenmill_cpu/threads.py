"""Which CPUs this process may run on, and sizing torch's thread pool to them."""

from __future__ import annotations

import os


def available_cpus() -> set[int]:
    """Logical CPUs in this process's affinity mask (cgroups and ``taskset`` shrink it)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def pin_threads(num_threads: int) -> bool:
    """Size torch's intra-op pool to ``num_threads`` unless the user set ``OMP_NUM_THREADS``
    (then torch already honours it). Returns whether the pool was resized."""
    if "OMP_NUM_THREADS" in os.environ:
        return False
    import torch

    torch.set_num_threads(num_threads)
    return True
