"""SharedSegment: one shared-memory file every rank of a group on this host maps, with a barrier in it.

Layout: a 4 KiB header (a random nonce naming the segment at byte 0; the barrier's ``arrived`` word at
byte 64 and ``generation`` word at byte 128, each on its own cache line), then the data area. The file
lives in ``/dev/shm``; the rank that created it unlinks it once every rank has mapped it, so nothing
outlives the processes, however they end. The barrier (``kernels/shm_barrier.c``) waits in the kernel
(a futex on the shared word), so a waiting rank yields its CPU.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import time
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tokenmill.plugin_api.native import build_native_library

SHM_DIR = Path("/dev/shm")
HEADER_BYTES = 4096
ARRIVED_OFFSET = 64
GENERATION_OFFSET = 128
ALIGNMENT = 64  # every slot starts on a cache line
WAIT_SLICE_NS = 500_000_000  # the barrier returns to Python this often to check its deadline and signals
SOURCE = Path(__file__).with_name("kernels") / "shm_barrier.c"


@lru_cache(maxsize=1)
def load_barrier() -> SimpleNamespace:
    """``arrive`` and ``await_`` of ``shm_barrier.c``, built on first use (NativeBuildError otherwise)."""
    library = build_native_library(SOURCE, "CPU shared-memory barrier")
    arrive, await_ = library.shm_barrier_arrive, library.shm_barrier_await
    arrive.argtypes, arrive.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32], ctypes.c_int64
    await_.argtypes, await_.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], ctypes.c_int32
    return SimpleNamespace(arrive=arrive, await_=await_)


def segment_path(nonce: int) -> Path:
    """Where the segment named by ``nonce`` lives."""
    return SHM_DIR / f"tokenmill-communicator-{nonce:016x}"


class BarrierTimeout(RuntimeError):
    """The other ranks did not reach the barrier in time (one died, or stopped making the same calls)."""


class SharedSegment:
    """A mapping of one segment file; ``data`` is its data area as a uint8 tensor."""

    def __init__(self, nonce: int, fd: int, size: int, created: bool) -> None:
        import torch

        self.nonce, self.size, self.created = nonce, size, created
        self.path = segment_path(nonce)
        try:
            self._map = mmap.mmap(fd, HEADER_BYTES + size, flags=mmap.MAP_SHARED,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        whole = torch.frombuffer(self._map, dtype=torch.uint8)
        self.data = whole[HEADER_BYTES:]
        self._header = whole[:HEADER_BYTES]
        base = whole.data_ptr()
        self._arrived, self._generation = base + ARRIVED_OFFSET, base + GENERATION_OFFSET
        self._barrier = load_barrier()

    @classmethod
    def create(cls, size: int) -> SharedSegment:
        """A new segment with ``size`` data bytes, its pages reserved now (OSError when ``/dev/shm`` has
        no room, rather than a SIGBUS at first touch)."""
        load_barrier()
        nonce = secrets.randbits(62) | 1
        fd = os.open(segment_path(nonce), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, HEADER_BYTES + size)
        except OSError:
            os.close(fd)
            segment_path(nonce).unlink(missing_ok=True)
            raise
        segment = cls(nonce, fd, size, created=True)
        segment._header[:8].copy_(_nonce_bytes(nonce))
        return segment

    @classmethod
    def attach(cls, nonce: int, size: int) -> SharedSegment:
        """The segment another rank created (FileNotFoundError when it is on another host; ValueError
        when the file there is not the one that rank made)."""
        load_barrier()
        path = segment_path(nonce)
        fd = os.open(path, os.O_RDWR)
        if os.fstat(fd).st_size != HEADER_BYTES + size:
            os.close(fd)
            raise ValueError(f"{path} is not {HEADER_BYTES + size} bytes long")
        segment = cls(nonce, fd, size, created=False)
        if not segment._header[:8].equal(_nonce_bytes(nonce)):
            segment.close()
            raise ValueError(f"{path} holds another segment's nonce")
        return segment

    def unlink(self) -> None:
        """Remove the file (the mappings stay valid); called once every rank has mapped it."""
        self.path.unlink(missing_ok=True)

    def wait(self, parties: int, timeout_s: float) -> None:
        """Return once all ``parties`` ranks called ``wait`` for this round; every write a rank made
        before its call is then visible to all. BarrierTimeout after ``timeout_s``."""
        seen = self._barrier.arrive(self._arrived, self._generation, parties)
        if seen < 0:
            return
        deadline = time.monotonic() + timeout_s
        while self._barrier.await_(self._generation, seen, min(WAIT_SLICE_NS, int(timeout_s * 1e9))):
            if time.monotonic() >= deadline:
                raise BarrierTimeout(f"waited {timeout_s:g} s for the other {parties - 1} rank(s) of the "
                                     f"shared-memory communicator: one died or stopped making the same calls")

    def close(self) -> None:
        """Unmap (when no tensor view of the data is left; otherwise when the last one goes)."""
        if self.created:
            self.unlink()
        self.data = self._header = None
        try:
            self._map.close()
        except BufferError:
            pass  # a view outlives the segment; the mapping goes with it


def _nonce_bytes(nonce: int) -> Any:
    import torch

    return torch.frombuffer(bytearray(nonce.to_bytes(8, "little")), dtype=torch.uint8)
