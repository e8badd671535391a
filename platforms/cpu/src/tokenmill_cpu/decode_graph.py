"""CpuDecodeGraph: one decode batch size recorded as its list of native kernel calls and replayed.

Implements the DecodeGraph contract of ``tokenmill.plugin_api.graphs`` for the CPU. A decode
step of a small model spends as long in Python (module calls, shape checks, pointer lookups) as in
its kernels; when every kernel of the forward pass is a C function called through
``tokenmill.plugin_api.native.native_call`` (the CPU layer kernels and attention, the packed GGUF matmul),
the forward is fully described by that list of calls and their arguments, and ``replay`` runs the
list alone: from C (``CallList``) where the calls fit its table, else from Python.

The capture is checked, not trusted: it runs under a dispatch mode that sees every PyTorch
operation of the forward. Allocations are kept alive by the graph (the recorded calls write to
them at every replay); views are free; any other operation computes something the list would not
redo, so the capture is declined (``GraphCaptureDeclined``) and steps run eagerly — e.g. dense
float32 layers, which run PyTorch's GEMM.

Graphs made by one platform share an ``ActivationArena``: the i-th allocation of every capture is
a view of the arena's i-th slot, so all graphs together keep about one largest forward's
activations (not one per batch size and prefill length). Sound because graphs replay one at a time
and every allocation is written by its own replay before it is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tokenmill.plugin_api.graphs import GraphCaptureDeclined
from tokenmill.plugin_api.native import NativeRecording
from tokenmill_cpu.call_list import CallList

aten = torch.ops.aten
ALLOCATIONS = frozenset({aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                         aten.empty_strided.default, aten.new_empty_strided.default})


def _aliases(op: Any) -> bool:
    """Whether ``op`` only returns views of its inputs (split, view, unsqueeze, slice, ...)."""
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


class ActivationArena:
    """Memory shared by the graphs of one platform, one slot per allocation index of a capture,
    grown when a capture needs more (graphs captured before keep the smaller slot they use)."""

    def __init__(self) -> None:
        self._slots: list[torch.Tensor] = []

    def place(self, index: int, allocated: torch.Tensor) -> torch.Tensor:
        """A tensor like ``allocated`` (shape, strides, dtype) on slot ``index``'s memory."""
        nbytes = allocated.untyped_storage().nbytes()
        if index < len(self._slots) and self._slots[index].numel() >= nbytes \
                and self._slots[index].device == allocated.device:
            slot = self._slots[index]
        else:
            slot = torch.empty(nbytes, dtype=torch.uint8, device=allocated.device)
            self._slots[index:index + 1] = [slot]
        return slot[:nbytes].view(allocated.dtype).as_strided(allocated.size(), allocated.stride(),
                                                               allocated.storage_offset())

    @property
    def nbytes(self) -> int:
        """The memory the slots hold."""
        return sum(slot.numel() for slot in self._slots)


class _ReplayGuard(TorchDispatchMode):
    """Keeps every tensor allocated inside it (on the arena's slots when given); refuses any
    operation that is neither an allocation nor a view."""

    def __init__(self, arena: ActivationArena | None) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []
        self._arena = arena

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in ALLOCATIONS:
            out = func(*args, **(kwargs or {}))
            if self._arena is not None:
                out = self._arena.place(len(self.kept), out)
            self.kept.append(out)
            return out
        if not _aliases(func):
            raise GraphCaptureDeclined(f"the forward runs {func} outside a native kernel (a CPU decode graph "
                                       f"replays native calls only)")
        return func(*args, **(kwargs or {}))


class CpuDecodeGraph:
    """A recorded decode forward: its native calls, the tensors they write, and its output."""

    freezes_plan = True

    def __init__(self, arena: ActivationArena | None = None) -> None:
        self._arena = arena
        self._recording: NativeRecording | None = None
        self._kept: list[torch.Tensor] = []
        self._output: torch.Tensor | None = None
        self._metadata: Any = None
        self._call_list: CallList | None = None
        self.replayed_from = ""  # "C", or "Python (why the call list does not take the calls)"

    def capture(self, plan: Callable[[], Any], forward: Callable[[Any], torch.Tensor]) -> None:
        """Plan once, run ``forward`` once eagerly (first-use work: building kernels, caches), then
        record it; GraphCaptureDeclined when it runs anything but native calls, allocations and views."""
        metadata = plan()
        forward(metadata)
        guard = _ReplayGuard(self._arena)
        with NativeRecording() as recording, guard:
            output = forward(metadata)
        if not recording.calls:
            raise GraphCaptureDeclined("the forward made no native calls")
        self._recording, self._kept, self._output, self._metadata = recording, guard.kept, output, metadata
        table = CallList.build(recording.calls)
        self._call_list = table if isinstance(table, CallList) else None
        self.replayed_from = "C" if self._call_list is not None else f"Python ({table})"

    def replay(self) -> torch.Tensor:
        """Run the recorded calls on the buffers' current contents (from C when the call list takes
        them); the same output tensor each time."""
        if self._recording is None or self._output is None:
            raise RuntimeError("replay() before capture()")
        if self._call_list is not None:
            self._call_list.run()
        else:
            self._recording.replay()
        return self._output

    @property
    def num_calls(self) -> int:
        """How many native calls one replay makes."""
        return len(self._recording.calls) if self._recording is not None else 0
