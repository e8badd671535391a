"""SharedSegment in one process: naming, the nonce check, unlinking, and the barrier's round and timeout
(the ranks' side is the communicator conformance, test_platform_cpu_communicator)."""

from __future__ import annotations

import time

import pytest

from tokenmill_cpu.shared_segment import BarrierTimeout, SharedSegment, load_barrier, segment_path


@pytest.fixture
def segment():
    try:
        load_barrier()
    except RuntimeError as error:  # NativeBuildError: no C compiler here
        pytest.skip(str(error))
    if not segment_path(1).parent.is_dir():
        pytest.skip("no /dev/shm")
    made = SharedSegment.create(4096)
    yield made
    made.close()


def test_attach_maps_the_same_memory_and_unlink_leaves_it_mapped(segment):
    other = SharedSegment.attach(segment.nonce, 4096)
    segment.data[:4].copy_(segment.data.new_tensor([1, 2, 3, 4]))
    assert other.data[:4].tolist() == [1, 2, 3, 4]
    segment.unlink()
    assert not segment.path.exists()
    other.data[4] = 9
    assert int(segment.data[4]) == 9
    other.close()


def test_attach_refuses_a_missing_or_foreign_segment(segment):
    with pytest.raises(FileNotFoundError):
        SharedSegment.attach(segment.nonce + 2, 4096)
    with pytest.raises(ValueError, match="bytes long"):
        SharedSegment.attach(segment.nonce, 8192)


def test_barrier_of_one_returns_and_of_two_times_out_with_a_reason(segment):
    for _ in range(3):
        segment.wait(1, timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(BarrierTimeout, match="other 1 rank"):
        segment.wait(2, timeout_s=0.2)
    assert 0.15 < time.monotonic() - start < 5.0


def test_close_removes_the_file_of_its_creator():
    try:
        load_barrier()
    except RuntimeError as error:
        pytest.skip(str(error))
    made = SharedSegment.create(128)
    path = made.path
    assert path.exists()
    made.close()
    assert not path.exists()
