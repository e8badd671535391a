"""SharedMemoryCommunicator: all-reduce, all-gather and reduce-scatter through one shared-memory segment
for the ranks of a group on one host; every other operation, and tensors larger than a slot, through the
``torch.distributed`` (gloo) communicator it wraps.

The data area holds two buffers of ``world_size`` slots. A call copies this rank's tensor into its slot
of the next buffer, waits at the segment's barrier (every rank has written), then reads every slot in
rank order: each rank adds the same values in the same order (bfloat16 and float16 in float32, rounded
once), so every rank gets the same bits, on every call. Calls alternate between the two buffers, which
makes one barrier a call enough: a rank writes a buffer again only after passing the next call's
barrier, which every rank reaches only once it finished reading that buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tokenmill.plugin_api import Communicator
from tokenmill.plugin_api.communicator import check_dim, check_divisible
from tokenmill_cpu.shared_segment import ALIGNMENT, BarrierTimeout, SharedSegment

logger = logging.getLogger(__name__)

DEFAULT_SLOT_BYTES = 4 << 20  # per rank and buffer: a decode step's activations, most prefill chunks'
DEFAULT_TIMEOUT_S = 300.0
BUFFERS = 2
CACHED_LAYOUTS = 64  # slot views kept per (buffer, dtype, shape): a model's calls repeat a few layouts


class SharedMemoryUnavailable(RuntimeError):
    """The ranks could not share a segment (another host, no /dev/shm, no room, no C compiler)."""


def _summed_dtypes() -> dict[Any, Any]:
    """dtype -> the dtype its sums are accumulated in."""
    import torch

    wide = {torch.bfloat16: torch.float32, torch.float16: torch.float32}
    return {dtype: wide.get(dtype, dtype) for dtype in
            (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)}


class SharedMemoryCommunicator(Communicator):
    """The reductions and gathers of ranks on one host through shared memory; ``fallback`` for the rest.

    Made by ``attach``, collectively. Owns ``fallback`` (destroyed with it)."""

    def __init__(self, fallback: Communicator, segment: SharedSegment, slot_bytes: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(fallback.rank, fallback.world_size, fallback.device, fallback.group)
        self.fallback, self.slot_bytes, self.timeout_s = fallback, slot_bytes, timeout_s
        self._segment: SharedSegment | None = segment
        self._calls = 0  # shared-memory calls so far; its parity picks the buffer
        self._views: dict[tuple[int, Any, tuple[int, ...]], list[Any]] = {}
        self._broken = ""  # set by a barrier timeout: the ranks no longer agree on the barrier's rounds
        self._accumulate = _summed_dtypes()

    @classmethod
    def attach(cls, fallback: Communicator, slot_bytes: int = DEFAULT_SLOT_BYTES,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> SharedMemoryCommunicator:
        """Rank 0 creates the segment and sends its name over ``fallback``; the others map it. Collective
        over ``fallback``'s group; every rank returns a communicator, or every rank raises
        SharedMemoryUnavailable (with this rank's reason) when any rank could not map the segment."""
        import torch

        slot_bytes = -(-slot_bytes // ALIGNMENT) * ALIGNMENT
        size = BUFFERS * fallback.world_size * slot_bytes
        segment, reason = None, ""
        name = torch.zeros(1, dtype=torch.int64)
        if fallback.rank == 0:
            try:
                segment = SharedSegment.create(size)
                name[0] = segment.nonce
            except Exception as error:  # noqa: BLE001 - any failure means: use the fallback
                reason = f"cannot create a {size >> 20} MiB shared-memory segment: {error}"
        name = fallback.broadcast(name, 0)
        if fallback.rank != 0 and int(name[0]):
            try:
                segment = SharedSegment.attach(int(name[0]), size)
            except FileNotFoundError:
                reason = "rank 0's shared-memory segment is not on this host"
            except Exception as error:  # noqa: BLE001
                reason = f"cannot map rank 0's shared-memory segment: {error}"
        missing = fallback.all_reduce(torch.tensor([0 if segment else 1], dtype=torch.int64))
        if segment is not None and segment.created:
            segment.unlink()  # every rank that could map it has: nothing stays in /dev/shm
        if int(missing[0]):
            if segment is not None:
                segment.close()
            raise SharedMemoryUnavailable(reason or f"{int(missing[0])} rank(s) could not map the shared-memory "
                                                    "segment (not on this host)")
        return cls(fallback, segment, slot_bytes, timeout_s)

    # -- the shared-memory path -----------------------------------------------------------------

    def _takes(self, tensor: Any, summed: bool) -> bool:
        return (self._segment is not None and tensor.device.type == "cpu"
                and tensor.numel() * tensor.element_size() <= self.slot_bytes
                and (not summed or tensor.dtype in self._accumulate))

    def _exchange(self, tensor: Any) -> list[Any]:
        """Every rank's ``tensor``, read from the segment in rank order, once all have written."""
        buffer = self._calls % BUFFERS
        self._calls += 1
        key = (buffer, tensor.dtype, tuple(tensor.shape))
        slots = self._views.get(key)
        if slots is None:
            if len(self._views) >= CACHED_LAYOUTS:
                self._views.clear()
            slots = self._views[key] = self._slot_views(buffer, tensor)
        slots[self.rank].copy_(tensor)
        self._wait()
        return slots

    def _wait(self) -> None:
        """The segment's barrier; after one timeout every later call raises at once."""
        if self._broken:
            raise RuntimeError(f"the shared-memory communicator is unusable: {self._broken}")
        try:
            self._segment.wait(self.world_size, self.timeout_s)
        except BarrierTimeout as timeout:
            self._broken = str(timeout)
            raise

    def _slot_views(self, buffer: int, tensor: Any) -> list[Any]:
        """Each rank's slot of ``buffer`` as a tensor of ``tensor``'s dtype and shape."""
        nbytes = tensor.numel() * tensor.element_size()
        first = buffer * self.world_size * self.slot_bytes
        data = self._segment.data
        return [data[first + r * self.slot_bytes:first + r * self.slot_bytes + nbytes].view(tensor.dtype)
                .view(tensor.shape) for r in range(self.world_size)]

    def _sum(self, parts: list[Any], out: Any) -> Any:
        """``out`` = the sum of ``parts`` in list order, accumulated in float32 for 16-bit floats."""
        import torch

        wide = self._accumulate[out.dtype]
        if wide == out.dtype:
            if len(parts) == 1:
                return out.copy_(parts[0])
            torch.add(parts[0], parts[1], out=out)
            for part in parts[2:]:
                out.add_(part)
            return out
        total = parts[0].to(wide)
        for part in parts[1:]:
            total.add_(part)
        return out.copy_(total)

    def all_reduce(self, tensor: Any) -> Any:
        """Through the segment when the dtype is a float or int type torch adds and it fits a slot; the
        result is written into ``tensor`` (into a contiguous copy if it is not contiguous)."""
        if not self._takes(tensor, summed=True):
            return self.fallback.all_reduce(tensor)
        slots = self._exchange(tensor)
        return self._sum(slots, tensor if tensor.is_contiguous() else tensor.contiguous())

    def all_gather(self, tensor: Any, dim: int = 0) -> Any:
        """Through the segment when ``tensor`` fits a slot (any dtype)."""
        import torch

        dim = check_dim(tensor, dim)
        if not self._takes(tensor, summed=False):
            return self.fallback.all_gather(tensor, dim)
        return torch.cat(self._exchange(tensor), dim)

    def reduce_scatter(self, tensor: Any, dim: int = 0) -> Any:
        """Through the segment like ``all_reduce``; each rank adds up only its own chunk."""
        import torch

        dim = check_dim(tensor, dim)
        check_divisible(tensor.shape[dim], self.world_size, f"reduce_scatter's dim {dim}")
        if not self._takes(tensor, summed=True):
            return self.fallback.reduce_scatter(tensor, dim)
        chunks = [slot.chunk(self.world_size, dim)[self.rank] for slot in self._exchange(tensor)]
        return self._sum(chunks, torch.empty(chunks[0].shape, dtype=tensor.dtype))

    def barrier(self) -> None:
        """The segment's barrier."""
        if self._segment is None:
            return self.fallback.barrier()
        self._wait()

    # -- through the fallback -------------------------------------------------------------------

    def send(self, tensor: Any, dst: int) -> None:
        """Through the fallback communicator."""
        self.fallback.send(tensor, dst)

    def recv(self, out: Any, src: int) -> Any:
        """Through the fallback communicator."""
        return self.fallback.recv(out, src)

    def broadcast(self, tensor: Any, src: int) -> Any:
        """Through the fallback communicator."""
        return self.fallback.broadcast(tensor, src)

    def all_to_all(self, tensor: Any, output_split_sizes: Sequence[int] | None = None,
                   input_split_sizes: Sequence[int] | None = None) -> Any:
        """Through the fallback communicator."""
        return self.fallback.all_to_all(tensor, output_split_sizes, input_split_sizes)

    def destroy(self) -> None:
        """Unmaps the segment and destroys the fallback."""
        if self._segment is not None:
            self._views.clear()
            self._segment.close()
            self._segment = None
            self.fallback.destroy()

    def describe(self) -> str:
        """``cpu shared memory (2 x 4 MiB slots a rank) + torch.distributed gloo, rank 0 of 2 on cpu``."""
        return (f"cpu shared memory ({BUFFERS} x {self.slot_bytes / (1 << 20):g} MiB slots a rank) for "
                f"all_reduce/all_gather/reduce_scatter + {self.fallback.describe()}")
