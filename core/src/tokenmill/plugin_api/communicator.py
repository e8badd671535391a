"""Communicator: the collective and point-to-point operations the ranks of one group run together.

Tensor parallelism sums partial products (``all_reduce``) and joins vocabulary shards
(``all_gather``), sequence-sharded layers use ``reduce_scatter``, pipeline stages hand activations on
(``send`` / ``recv``) and expert parallelism routes tokens to the ranks holding their experts
(``all_to_all``). A platform returns one from ``Platform.create_communicator``: by default
``TorchDistributedCommunicator`` over ``torch.distributed`` with the platform's backend; a platform
with a faster transport (the CPU's shared memory, a vendor library) returns its own and passes what it
does not accelerate to the default.

Rules every implementation keeps (the testkit's ``CommunicatorConformance`` checks them):

* Ranks are positions in the group, ``0 .. world_size - 1``, never global process ranks.
* Every rank of the group makes the same collective calls in the same order, with tensors of the
  same dtype and device and, unless a method says otherwise, the same shape (calls that differ between
  ranks are the caller's bug, which a communicator need not detect). A call some ranks never make
  raises after the communicator's timeout instead of blocking for ever.
* Tensors live on ``device``; inputs may be non-contiguous, every returned tensor is contiguous.
* A reduction's result has the same bits on every rank (tensor-parallel ranks must agree on every
  logit, or their sampled tokens differ). Sums are computed in the tensor's dtype or wider; a rank
  order is fixed per communicator, so the same inputs give the same result on every call.
* Unless a method says it works in place, its input is left unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


class Communicator(ABC):
    """The operations of one group of ranks. Subclasses implement every abstract method; the
    constructor arguments become the public attributes below."""

    rank: int
    """This process's position in the group, ``0 .. world_size - 1``."""

    world_size: int
    """How many ranks the group has (1 is allowed: every operation then returns its input's value)."""

    device: Any
    """The ``torch.device`` every tensor of every call lives on."""

    group: Any
    """The ``torch.distributed`` process group underneath, or None for a transport without one."""

    def __init__(self, rank: int, world_size: int, device: Any, group: Any = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of {world_size}")
        self.rank, self.world_size, self.device, self.group = rank, world_size, device, group

    @abstractmethod
    def all_reduce(self, tensor: Any) -> Any:
        """The elementwise sum of ``tensor`` over all ranks, same shape, dtype and device.

        May work in place: the result may be ``tensor`` itself, overwritten. Callers use the returned
        tensor and treat ``tensor`` as consumed. Every rank receives the same bits."""

    @abstractmethod
    def all_gather(self, tensor: Any, dim: int = 0) -> Any:
        """Every rank's ``tensor`` concatenated along ``dim`` in rank order: a new tensor whose
        ``dim`` is ``world_size`` times as long. ``tensor`` has the same shape on every rank
        (negative ``dim`` counts from the end)."""

    @abstractmethod
    def reduce_scatter(self, tensor: Any, dim: int = 0) -> Any:
        """This rank's part of the sum: the elementwise sum of ``tensor`` over all ranks, split along
        ``dim`` into ``world_size`` equal chunks, chunk ``rank`` returned as a new tensor.
        ``tensor.shape[dim]`` must divide by ``world_size`` (ValueError otherwise)."""

    @abstractmethod
    def send(self, tensor: Any, dst: int) -> None:
        """Send ``tensor`` to rank ``dst`` (not this rank), for pipeline stages. Returns when
        ``tensor`` may be reused, not necessarily when it arrived. Each send pairs with one ``recv`` on
        ``dst`` of the same shape and dtype; sends from one rank to another arrive in order.
        Not a collective: only the two ranks take part."""

    @abstractmethod
    def recv(self, out: Any, src: int) -> Any:
        """Receive the next tensor rank ``src`` sends into ``out`` (contiguous, the sender's shape and
        dtype; ValueError if not contiguous), and return ``out``. Blocks until it arrived."""

    @abstractmethod
    def broadcast(self, tensor: Any, src: int) -> Any:
        """Rank ``src``'s ``tensor`` on every rank, in place: every rank's ``tensor`` is overwritten
        with ``src``'s values (``src``'s own is unchanged) and returned."""

    @abstractmethod
    def all_to_all(self, tensor: Any, output_split_sizes: Sequence[int] | None = None,
                   input_split_sizes: Sequence[int] | None = None) -> Any:
        """Exchange slices of ``tensor`` along dim 0, for expert parallelism: ``tensor`` is split into
        ``world_size`` consecutive pieces, piece ``j`` goes to rank ``j``, and the result (a new tensor)
        is the pieces received from ranks ``0 .. world_size - 1`` concatenated along dim 0.

        Without split sizes every piece has ``tensor.shape[0] / world_size`` rows (ValueError unless
        that divides). ``input_split_sizes[j]`` is how many rows this rank sends to rank ``j``;
        ``output_split_sizes[j]`` how many it receives from rank ``j`` (what rank ``j`` sends it, which
        the caller learns first, typically with an ``all_to_all`` of the counts). Other dimensions are
        equal on every rank."""

    @abstractmethod
    def barrier(self) -> None:
        """Return only once every rank of the group has called ``barrier``."""

    @abstractmethod
    def destroy(self) -> None:
        """Release what the communicator holds (its group if it created it, shared memory). Called
        once by every rank when the group is done; no other method is called afterwards. Idempotent."""

    def describe(self) -> str:
        """One line for the startup report and logs: the transport and the group's size. Optional."""
        return f"{type(self).__name__} (rank {self.rank} of {self.world_size}, {self.device})"


def check_dim(tensor: Any, dim: int) -> int:
    """``dim`` as a non-negative index into ``tensor``'s dimensions; IndexError if out of range."""
    ndim = tensor.dim()
    if not -ndim <= dim < ndim:
        raise IndexError(f"dim {dim} is out of range for a tensor of {ndim} dimensions")
    return dim % ndim


def check_divisible(length: int, world_size: int, what: str) -> int:
    """``length // world_size``; ValueError naming ``what`` when ``world_size`` does not divide it."""
    if length % world_size:
        raise ValueError(f"{what} of {length} does not divide among {world_size} ranks")
    return length // world_size
