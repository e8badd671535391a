"""The CPU platform's communicator through the testkit's conformance: ranks on this host get the
shared-memory one (its 4 MiB+ case runs over the gloo fallback), at two and three ranks; with a small
slot every tensor that does not fit takes the fallback inside the same run; and ranks that cannot see
each other's segment (as on two hosts) all keep gloo."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch.distributed as dist

import tokenmill_cpu.shared_segment
from tokenmill.plugin_api import TorchDistributedCommunicator
from tokenmill_cpu.platform import CpuPlatform
from tokenmill_cpu.shared_memory_communicator import SharedMemoryCommunicator
from tokenmill_testkit import CommunicatorConformance


def small_slot_communicator() -> SharedMemoryCommunicator:
    """Slots of 256 bytes: the 40 small all-reduces go through shared memory, most other cases do not."""
    return SharedMemoryCommunicator.attach(TorchDistributedCommunicator.create("gloo"), slot_bytes=256)


class TestCpuPlatformCommunicator(CommunicatorConformance):
    platform_cls = CpuPlatform

    def test_ranks_on_one_host_share_memory(self, ranks) -> None:
        for report in self.reports(ranks):
            assert report["meta"]["describe"].startswith("cpu shared memory"), report["meta"]


class TestSharedMemorySmallSlots(CommunicatorConformance):
    communicator_factory = small_slot_communicator


class TestCpuPlatformCommunicatorThreeRanks(CommunicatorConformance):
    """An odd group: three slots a buffer, uneven chunks of work for every rank."""

    platform_cls = CpuPlatform
    world_size = 3

    def test_ranks_on_one_host_share_memory(self, ranks) -> None:
        for report in self.reports(ranks):
            assert report["meta"]["describe"].startswith("cpu shared memory"), report["meta"]


def communicator_of_separate_hosts():
    """The platform's communicator, rank 1 and up looking for segments in a folder of their own, as if
    each ran on another host."""
    if dist.get_rank() > 0:
        other_host = tempfile.TemporaryDirectory(prefix="tokenmill-other-host-")  # removed at exit
        tokenmill_cpu.shared_segment.SHM_DIR = Path(other_host.name)
        communicator_of_separate_hosts.folder = other_host
    return CpuPlatform().create_communicator()


class TestCpuPlatformCommunicatorAcrossHosts(CommunicatorConformance):
    communicator_factory = communicator_of_separate_hosts

    def test_every_rank_keeps_gloo(self, ranks) -> None:
        for report in self.reports(ranks):
            assert report["meta"]["describe"].startswith("torch.distributed gloo"), report["meta"]
