"""The communicator conformance cases: each rank's inputs, the operation, and the result single-process
math gives, for any world size.

Inputs are random but reproducible from the case name and the rank, so the process that checks the
results regenerates every rank's inputs instead of receiving them. Shapes are odd on purpose (7 x 13,
a vector of one element, a transposed view, one tensor of 4 MiB and more) so a communicator that only
handles aligned, contiguous or small tensors fails here rather than in a model.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

LARGE_ELEMENTS = (1031, 1019)  # float32: 4.2 MB, past a 4 MiB buffer, so transports' fallbacks run too
REPEATS = 40  # all_reduce calls in a row: a transport reusing buffers must not mix up two calls

# (atol, rtol) of a sum of a few ranks' values against the same sum in float64 rounded once
SUM_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


@dataclass(frozen=True)
class CommunicatorCase:
    """One call of one operation: ``operation`` on a tensor of ``shape`` (per rank, see ``input``)."""

    name: str
    operation: str  # all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send_recv
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    dim: int = 0
    transposed: bool = False  # the input is a non-contiguous view: ``shape`` generated, then ``.t()``
    options: dict[str, Any] = field(default_factory=dict)

    def input(self, rank: int, world_size: int, tag: str = "") -> torch.Tensor:
        """Rank ``rank``'s input, the same in every process (on the CPU)."""
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.name}/{rank}/{tag}".encode()))
        shape = self.input_shape(rank, world_size)
        if self.dtype.is_floating_point:
            tensor = torch.randn(shape, generator=generator).to(self.dtype)
        else:
            tensor = torch.randint(-1000, 1000, shape, generator=generator, dtype=self.dtype)
        return tensor.t() if self.transposed else tensor

    def input_shape(self, rank: int, world_size: int) -> tuple[int, ...]:
        """``shape``, except the rows an uneven all_to_all sends, which depend on the rank."""
        if self.options.get("uneven"):
            return (sum(send_counts(rank, world_size)), *self.shape[1:])
        return self.shape

    def tolerance(self) -> tuple[float, float] | None:
        """(atol, rtol) for sums of floating-point values; None where results must be exact."""
        if self.operation in ("all_reduce", "reduce_scatter") and self.dtype.is_floating_point:
            return SUM_TOLERANCES[self.dtype]
        return None


def send_counts(rank: int, world_size: int) -> list[int]:
    """Rows rank ``rank`` sends to each rank in the uneven all_to_all: ``rank + j + 1`` to rank ``j``
    (so rank ``j`` receives ``j + rank + 1`` rows from it, the same formula)."""
    return [rank + j + 1 for j in range(world_size)]


def cases(world_size: int) -> list[CommunicatorCase]:
    """Every case for a group of ``world_size`` ranks."""
    w = world_size
    return [
        CommunicatorCase("all_reduce_float32", "all_reduce", (7, 13)),
        CommunicatorCase("all_reduce_one_element", "all_reduce", (1,)),
        CommunicatorCase("all_reduce_bfloat16", "all_reduce", (5, 33), torch.bfloat16),
        CommunicatorCase("all_reduce_float16", "all_reduce", (3, 17), torch.float16),
        CommunicatorCase("all_reduce_int64", "all_reduce", (11,), torch.int64),
        CommunicatorCase("all_reduce_transposed", "all_reduce", (13, 7), transposed=True),
        CommunicatorCase("all_reduce_large", "all_reduce", LARGE_ELEMENTS),
        CommunicatorCase("all_reduce_large_bfloat16", "all_reduce", LARGE_ELEMENTS, torch.bfloat16),
        CommunicatorCase("all_reduce_repeated", "all_reduce", (64,), options={"repeats": REPEATS}),
        CommunicatorCase("all_gather_dim0", "all_gather", (3, 5)),
        CommunicatorCase("all_gather_dim1_bfloat16", "all_gather", (4, 7), torch.bfloat16, dim=1),
        CommunicatorCase("all_gather_last_dim", "all_gather", (2, 3, 5), dim=-1),
        CommunicatorCase("all_gather_int64", "all_gather", (5,), torch.int64),
        CommunicatorCase("reduce_scatter_dim0", "reduce_scatter", (3 * w, 5)),
        CommunicatorCase("reduce_scatter_dim1_bfloat16", "reduce_scatter", (5, 2 * w), torch.bfloat16, dim=1),
        CommunicatorCase("broadcast_from_last", "broadcast", (4, 6), options={"src": w - 1}),
        CommunicatorCase("broadcast_bfloat16_from_first", "broadcast", (9,), torch.bfloat16, options={"src": 0}),
        CommunicatorCase("all_to_all_equal", "all_to_all", (2 * w, 3)),
        CommunicatorCase("all_to_all_uneven_bfloat16", "all_to_all", (0, 5), torch.bfloat16, options={"uneven": True}),
        CommunicatorCase("send_recv_float32", "send_recv", (3, 7), options={"messages": 2}),
        CommunicatorCase("send_recv_bfloat16", "send_recv", (1, 129), torch.bfloat16, options={"messages": 1}),
    ]


def messages(case: CommunicatorCase, world_size: int) -> list[tuple[int, int, int]]:
    """The send_recv traffic as (source, destination, sequence number), in the one order every rank
    follows: for each pair a < b, ``a`` sends its messages to ``b``, then ``b`` answers with as many."""
    traffic = []
    for a in range(world_size):
        for b in range(a + 1, world_size):
            for source, destination in ((a, b), (b, a)):
                traffic += [(source, destination, m) for m in range(case.options["messages"])]
    return traffic


def expected(case: CommunicatorCase, rank: int, world_size: int) -> torch.Tensor | list[torch.Tensor]:
    """What ``rank`` must get, computed in one process (sums in float64, rounded once)."""
    if "repeats" in case.options:
        return [_sum([case.input(r, world_size, f"call{i}") for r in range(world_size)], case.dtype)
                for i in range(case.options["repeats"])]
    inputs = [case.input(r, world_size) for r in range(world_size)]
    op = case.operation
    if op == "all_reduce":
        return _sum(inputs, case.dtype)
    if op == "reduce_scatter":
        return _sum(inputs, case.dtype).chunk(world_size, case.dim)[rank].contiguous()
    if op == "all_gather":
        return torch.cat(inputs, case.dim)
    if op == "broadcast":
        return inputs[case.options["src"]]
    if op == "all_to_all":
        pieces = []
        for source, tensor in enumerate(inputs):
            counts = send_counts(source, world_size) if case.options.get("uneven") else None
            parts = tensor.split(counts) if counts else tensor.chunk(world_size)
            pieces.append(parts[rank])
        return torch.cat(pieces)
    if op == "send_recv":
        return [case.input(s, world_size, f"{d}/{m}") for s, d, m in messages(case, world_size) if d == rank]
    raise ValueError(f"unknown operation {op!r}")


def _sum(inputs: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    wide = [x.double() if dtype.is_floating_point else x for x in inputs]
    return torch.stack(wide).sum(0).to(dtype).contiguous()


def run(case: CommunicatorCase, communicator: Any) -> tuple[torch.Tensor | list[torch.Tensor], list[str]]:
    """Run ``case`` on ``communicator`` in one rank's process: the result on the CPU, and the contract's
    rules the call broke (an input it changed, a result that is not contiguous or has another dtype)."""
    rank, world_size, device = communicator.rank, communicator.world_size, communicator.device
    op = case.operation
    if "repeats" in case.options:
        results = [communicator.all_reduce(case.input(rank, world_size, f"call{i}").to(device))
                   for i in range(case.options["repeats"])]
        return [r.cpu() for r in results], _result_problems(case, results[-1])
    if op == "send_recv":
        received = []
        for source, destination, m in messages(case, world_size):
            if source == rank:
                communicator.send(case.input(rank, world_size, f"{destination}/{m}").to(device), destination)
            elif destination == rank:
                out = torch.empty(case.shape, dtype=case.dtype, device=device)
                received.append(communicator.recv(out, source).cpu())
        return received, []
    tensor = case.input(rank, world_size).to(device)
    calls: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: communicator.all_reduce(tensor),
        "all_gather": lambda: communicator.all_gather(tensor, case.dim),
        "reduce_scatter": lambda: communicator.reduce_scatter(tensor, case.dim),
        "broadcast": lambda: communicator.broadcast(tensor, case.options["src"]),
        "all_to_all": lambda: _all_to_all(case, communicator, tensor),
    }
    result = calls[op]()
    problems = _result_problems(case, result)
    if op not in ("all_reduce", "broadcast") and not torch.equal(tensor.cpu(), case.input(rank, world_size)):
        problems.append(f"{op} changed its input tensor")
    if op == "broadcast" and result is not tensor:
        problems.append("broadcast must return the tensor it was given (it works in place)")
    return result.cpu(), problems


def _result_problems(case: CommunicatorCase, result: Any) -> list[str]:
    if not isinstance(result, torch.Tensor):
        return [f"{case.operation} returned {type(result).__name__}, not a tensor"]
    problems = []
    if result.dtype != case.dtype:
        problems.append(f"{case.operation} returned {result.dtype} for a {case.dtype} input")
    if not result.is_contiguous():
        problems.append(f"{case.operation} returned a non-contiguous tensor")
    return problems


def _all_to_all(case: CommunicatorCase, communicator: Any, tensor: torch.Tensor) -> torch.Tensor:
    if not case.options.get("uneven"):
        return communicator.all_to_all(tensor)
    rank, world_size = communicator.rank, communicator.world_size
    received = [send_counts(j, world_size)[rank] for j in range(world_size)]
    return communicator.all_to_all(tensor, received, send_counts(rank, world_size))
