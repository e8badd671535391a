"""TorchDistributedCommunicator: the default Communicator, every operation one ``torch.distributed`` call.

It runs over any backend torch.distributed has (gloo, nccl, which is RCCL under ROCm, xccl, ...):
``Platform.create_communicator`` creates it with a new group of the platform's
``distributed_backend``. torch is imported on first use, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from tokenmill.plugin_api.communicator import Communicator, check_dim, check_divisible


def _dist() -> Any:
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                           "in every process before creating a communicator")
    return dist


class TorchDistributedCommunicator(Communicator):
    """Collectives of one ``torch.distributed`` process group, on ``device``.

    ``group`` None means the default (world) group. A communicator made by ``create`` owns its
    group and destroys it in ``destroy``; one given a group leaves it to its creator."""

    def __init__(self, group: Any = None, device: Any = None, *, owns_group: bool = False) -> None:
        import torch

        dist = _dist()
        group = dist.group.WORLD if group is None else group
        super().__init__(dist.get_rank(group), dist.get_world_size(group),
                         torch.device("cpu") if device is None else torch.device(device), group)
        self.backend = str(dist.get_backend(group))
        self._owns_group, self._destroyed = owns_group, False

    @classmethod
    def create(cls, backend: str, ranks: Sequence[int] | None = None, device: Any = None,
               timeout_s: float | None = None) -> TorchDistributedCommunicator | None:
        """A new group of ``backend`` among the global ``ranks`` (None: every process), and a
        communicator over it, or None in a process outside ``ranks``.

        Collective over the default group, as ``torch.distributed.new_group`` is: every process calls
        it with the same arguments, in the same order as its other group creations, after
        ``init_process_group``. ``timeout_s`` bounds each operation (None: torch's default)."""
        dist = _dist()
        members = None if ranks is None else sorted(int(r) for r in ranks)
        timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
        group = dist.new_group(ranks=members, backend=backend, timeout=timeout)
        if members is not None and dist.get_rank() not in members:
            return None
        return cls(group, device, owns_group=True)

    def _global(self, group_rank: int) -> int:
        if not 0 <= group_rank < self.world_size:
            raise ValueError(f"rank {group_rank} is outside a group of {self.world_size}")
        return _dist().get_global_rank(self.group, group_rank)

    def all_reduce(self, tensor: Any) -> Any:
        """In place when ``tensor`` is contiguous (then it is the result), else into a contiguous copy."""
        buffer = tensor.contiguous()
        _dist().all_reduce(buffer, group=self.group)
        return buffer

    def all_gather(self, tensor: Any, dim: int = 0) -> Any:
        """One gather into a tensor of ``world_size`` times the rows of ``tensor`` moved to dim 0."""
        import torch

        dist = _dist()
        dim = check_dim(tensor, dim)
        rows = tensor.movedim(dim, 0).contiguous()
        out = torch.empty((self.world_size * rows.shape[0], *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, rows, group=self.group)
        return out.movedim(0, dim).contiguous()

    def reduce_scatter(self, tensor: Any, dim: int = 0) -> Any:
        """One reduce-scatter of ``tensor`` with ``dim`` moved to dim 0."""
        import torch

        dist = _dist()
        dim = check_dim(tensor, dim)
        chunk = check_divisible(tensor.shape[dim], self.world_size, f"reduce_scatter's dim {dim}")
        rows = tensor.movedim(dim, 0).contiguous()
        out = torch.empty((chunk, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, rows, group=self.group)
        return out.movedim(0, dim).contiguous()

    def send(self, tensor: Any, dst: int) -> None:
        """``torch.distributed.send`` to ``dst``'s global rank."""
        if dst == self.rank:
            raise ValueError(f"rank {dst} cannot send to itself")
        _dist().send(tensor.contiguous(), dst=self._global(dst), group=self.group)

    def recv(self, out: Any, src: int) -> Any:
        """``torch.distributed.recv`` from ``src``'s global rank into ``out``."""
        if not out.is_contiguous():
            raise ValueError("recv needs a contiguous output tensor")
        if src == self.rank:
            raise ValueError(f"rank {src} cannot receive from itself")
        _dist().recv(out, src=self._global(src), group=self.group)
        return out

    def broadcast(self, tensor: Any, src: int) -> Any:
        """``torch.distributed.broadcast`` from ``src``, copied back when ``tensor`` is not contiguous."""
        buffer = tensor.contiguous()
        _dist().broadcast(buffer, src=self._global(src), group=self.group)
        if buffer.data_ptr() != tensor.data_ptr():
            tensor.copy_(buffer)
        return tensor

    def all_to_all(self, tensor: Any, output_split_sizes: Sequence[int] | None = None,
                   input_split_sizes: Sequence[int] | None = None) -> Any:
        """``torch.distributed.all_to_all_single`` along dim 0."""
        import torch

        if input_split_sizes is None:
            check_divisible(tensor.shape[0], self.world_size, "all_to_all's dim 0")
        elif len(input_split_sizes) != self.world_size or sum(input_split_sizes) != tensor.shape[0]:
            raise ValueError(f"input_split_sizes {list(input_split_sizes)} must be {self.world_size} "
                             f"counts adding up to {tensor.shape[0]} rows")
        if output_split_sizes is not None and len(output_split_sizes) != self.world_size:
            raise ValueError(f"output_split_sizes needs {self.world_size} counts, got {len(output_split_sizes)}")
        rows = tensor.contiguous()
        received = tensor.shape[0] if output_split_sizes is None else sum(output_split_sizes)
        out = torch.empty((received, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        _dist().all_to_all_single(out, rows, output_split_sizes=None if output_split_sizes is None
                                  else list(output_split_sizes),
                                  input_split_sizes=None if input_split_sizes is None else list(input_split_sizes),
                                  group=self.group)
        return out

    def barrier(self) -> None:
        """A one-element all-reduce on ``device``, read back on the host: every backend runs it the
        same way (no backend-specific device arguments) and it also waits for the device."""
        import torch

        token = torch.zeros(1, device=self.device)
        _dist().all_reduce(token, group=self.group)
        token.cpu()

    def destroy(self) -> None:
        """Destroys the group when this communicator created it."""
        if self._destroyed:
            return
        self._destroyed = True
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group(self.group)

    def describe(self) -> str:
        """``torch.distributed gloo, rank 0 of 2 on cpu``."""
        return f"torch.distributed {self.backend}, rank {self.rank} of {self.world_size} on {self.device}"
