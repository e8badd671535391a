"""SharedMemoryCommunicator's failure mode in one process: a rank whose peer never arrives (it died)
times out with a reason, and every later call raises at once instead of waiting again. Working
groups are the communicator conformance (test_platform_cpu_communicator)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from tokenmill_cpu.shared_memory_communicator import SharedMemoryCommunicator
from tokenmill_cpu.shared_segment import BarrierTimeout, SharedSegment, load_barrier


def test_a_missing_peer_times_out_once_then_every_call_raises_at_once():
    try:
        load_barrier()
    except RuntimeError as error:  # NativeBuildError: no C compiler here
        pytest.skip(str(error))
    segment = SharedSegment.create(2 * 2 * 256)
    # rank 0 of a pair whose rank 1 is gone: only the group's identity is read, no fallback call is made
    group_of_two = SimpleNamespace(rank=0, world_size=2, device=torch.device("cpu"), group=None)
    communicator = SharedMemoryCommunicator(group_of_two, segment, slot_bytes=256, timeout_s=0.3)
    try:
        start = time.monotonic()
        with pytest.raises(BarrierTimeout, match="waited 0.3 s for the other 1 rank"):
            communicator.all_reduce(torch.ones(4))
        assert time.monotonic() - start >= 0.25
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="unusable: waited 0.3 s"):
            communicator.all_gather(torch.ones(4))
        with pytest.raises(RuntimeError, match="unusable"):
            communicator.barrier()
        assert time.monotonic() - start < 0.25
    finally:
        segment.close()
