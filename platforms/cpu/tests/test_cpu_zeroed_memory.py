"""zeroed_tensor (the CPU platform's ``allocate_kv_cache``): zeros of any dtype and shape without writing
the memory."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

from tokenmill_cpu.platform import CpuPlatform
from tokenmill_cpu.zeroed_memory import zeroed_tensor


def _vm_flags(smaps: str, address: int) -> list[str]:
    """The VmFlags of the mapping in /proc/self/smaps that holds ``address``."""
    inside = False
    for line in smaps.splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8])
def test_zeros_of_the_shape_and_dtype(dtype):
    tensor = zeroed_tensor((3, 5, 7), dtype)
    assert tensor.shape == (3, 5, 7) and tensor.dtype == dtype and tensor.is_contiguous()
    assert torch.count_nonzero(tensor) == 0
    tensor[1, 2, 3] = 1
    assert tensor.sum().item() == 1


def test_page_aligned_and_writable_after_the_caller_drops_other_references():
    tensor = CpuPlatform().allocate_kv_cache((1024, 16), torch.float32)
    assert tensor.data_ptr() % 4096 == 0
    view = tensor[3:]
    del tensor
    view.fill_(2.0)
    assert view.sum().item() == 2.0 * view.numel()


def test_empty_shape():
    assert zeroed_tensor((0, 4), torch.float32).numel() == 0


def test_a_large_allocation_is_not_resident_until_written():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensor = zeroed_tensor((256, 1024, 1024), torch.uint8)  # 256 MiB
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 1000  # 65536 pages if written
    tensor[:1].fill_(1)
    assert tensor[0].sum().item() == 1024 * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_the_mapping_is_private():
    tensor = zeroed_tensor((4, 1024, 1024), torch.uint8)
    with open("/proc/self/smaps") as f:
        flags = _vm_flags(f.read(), tensor.data_ptr())
    assert "sh" not in flags  # a shared anonymous mapping is shmem: slower for attention to read
