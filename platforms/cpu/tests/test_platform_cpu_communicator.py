"""The CPU platform's communicator through the testkit's conformance: ranks on this host get the
shared-memory one (its 4 MiB+ case runs over the gloo fallback), and with a small slot every tensor
that does not fit takes the fallback inside the same run."""

from __future__ import annotations

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
