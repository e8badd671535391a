"""The communicator contract in one process: a group of one over gloo (every operation gives back its
input's values), the argument checks every implementation shares, and the one-line error without
torch.distributed. Groups of several ranks are the testkit's conformance (plugins/testkit/tests)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tokenmill.plugin_api import Communicator, TorchDistributedCommunicator
from tokenmill.reference.platform import ReferencePlatform


@pytest.fixture
def single_rank():
    """A default group of one process (an in-memory store: nothing listens on a port)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        communicator = ReferencePlatform().create_communicator()
        yield communicator
        communicator.destroy()
    finally:
        dist.destroy_process_group()


def test_without_torch_distributed_the_error_says_what_to_call():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ReferencePlatform().create_communicator()


def test_a_group_of_one_returns_its_input(single_rank):
    c = single_rank
    assert isinstance(c, TorchDistributedCommunicator) and (c.rank, c.world_size) == (0, 1)
    assert c.describe() == "torch.distributed gloo, rank 0 of 1 on cpu"
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    assert torch.equal(c.all_reduce(x.clone()), x)
    transposed = c.all_reduce(x.t())
    assert transposed.is_contiguous() and torch.equal(transposed, x.t())
    assert torch.equal(c.all_gather(x, dim=-1), x) and torch.equal(c.reduce_scatter(x, dim=1), x)
    assert torch.equal(c.all_to_all(x), x) and torch.equal(c.all_to_all(x, [3], [3]), x)
    target = x.clone()
    assert c.broadcast(target, 0) is target and torch.equal(target, x)
    c.barrier()
    c.destroy()
    c.destroy()


def test_arguments_are_checked_before_any_communication(single_rank):
    c = single_rank
    x = torch.zeros(3, 4)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        c.all_gather(x, dim=2)
    with pytest.raises(ValueError, match=r"input_split_sizes \[1, 1\] must be 1 counts adding up to 3 rows"):
        c.all_to_all(x, None, [1, 1])
    with pytest.raises(ValueError, match="output_split_sizes needs 1 counts, got 2"):
        c.all_to_all(x, [1, 2], None)
    with pytest.raises(ValueError, match="cannot send to itself"):
        c.send(x, 0)
    with pytest.raises(ValueError, match="contiguous"):
        c.recv(x.t(), 0)
    with pytest.raises(ValueError, match="outside a group of 1"):
        c.broadcast(x, 1)


def test_rank_must_lie_in_the_group():
    class Nothing(Communicator):
        all_reduce = all_gather = reduce_scatter = send = recv = broadcast = all_to_all = barrier = destroy = None

    with pytest.raises(ValueError, match="rank 2 is outside a group of 2"):
        Nothing(2, 2, "cpu")
    assert Nothing(1, 2, "cpu").describe() == "Nothing (rank 1 of 2, cpu)"
