"""CpuDecodeGraph: one decode batch size recorded as its list of native kernel calls and replayed.

Implements the DecodeGraph contract of ``tokenmill.runner.graph_runner`` for the CPU. A decode
step of a small model spends as long in Python (module calls, shape checks, pointer lookups) as in
its kernels; when every kernel of the forward pass is a C function called through
``tokenmill.layers.native_call`` (the CPU layer kernels and attention, the packed GGUF matmul),
the forward is fully described by that list of calls and their arguments, and ``replay`` runs the
list alone.

The capture is checked, not trusted: it runs under a dispatch mode that sees every PyTorch
operation of the forward. Allocations are kept alive by the graph (the recorded calls write to
them at every replay); views are free; any other operation computes something the list would not
redo, so the capture is declined (``GraphCaptureDeclined``) and steps run eagerly — e.g. dense
float32 layers, which run PyTorch's GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tokenmill.layers.native_calls import NativeRecording
from tokenmill.runner.graph_runner import GraphCaptureDeclined

aten = torch.ops.aten
ALLOCATIONS = frozenset({aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                         aten.empty_strided.default, aten.new_empty_strided.default})


def _aliases(op: Any) -> bool:
    """Whether ``op`` only returns views of its inputs (split, view, unsqueeze, slice, ...)."""
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


class _ReplayGuard(TorchDispatchMode):
    """Keeps every tensor allocated inside it; refuses any operation that is neither an allocation
    nor a view."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in ALLOCATIONS:
            out = func(*args, **(kwargs or {}))
            self.kept.append(out)
            return out
        if not _aliases(func):
            raise GraphCaptureDeclined(f"the forward runs {func} outside a native kernel (a CPU decode graph "
                                       f"replays native calls only)")
        return func(*args, **(kwargs or {}))


class CpuDecodeGraph:
    """A recorded decode forward: its native calls, the tensors they write, and its output."""

    freezes_plan = True

    def __init__(self) -> None:
        self._recording: NativeRecording | None = None
        self._kept: list[torch.Tensor] = []
        self._output: torch.Tensor | None = None
        self._metadata: Any = None

    def capture(self, plan: Callable[[], Any], forward: Callable[[Any], torch.Tensor]) -> None:
        """Plan once, run ``forward`` once eagerly (first-use work: building kernels, caches), then
        record it; GraphCaptureDeclined when it runs anything but native calls, allocations and views."""
        metadata = plan()
        forward(metadata)
        guard = _ReplayGuard()
        with NativeRecording() as recording, guard:
            output = forward(metadata)
        if not recording.calls:
            raise GraphCaptureDeclined("the forward made no native calls")
        self._recording, self._kept, self._output, self._metadata = recording, guard.kept, output, metadata

    def replay(self) -> torch.Tensor:
        """Run the recorded calls on the buffers' current contents; the same output tensor each time."""
        if self._recording is None or self._output is None:
            raise RuntimeError("replay() before capture()")
        self._recording.replay()
        return self._output

    @property
    def num_calls(self) -> int:
        """How many native calls one replay makes."""
        return len(self._recording.calls) if self._recording is not None else 0
