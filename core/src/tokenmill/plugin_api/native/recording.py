"""native_call and NativeRecording: run a kernel's ctypes function so that a CPU decode graph can record it.

Kernels written in C (a platform's layer kernels and attention, a quantizer's matmul) call their
ctypes function through ``native_call(function, *args)``. Outside a recording that is just the
call. Inside ``NativeRecording`` — a decode graph capturing one forward pass — the call is also
appended to the recording, and replaying the list later re-runs the same arithmetic without the
Python around it.

Replaying is only sound when every argument means the same thing at every replay: the addresses
of tensors that stay alive and in place (static input buffers, weights, caches, and outputs the
graph keeps), and sizes and scalars fixed for the graph's batch size. Values that vary per step
must live in such buffers, never in the arguments.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_state = threading.local()


class NativeRecording:
    """The native calls made by this thread inside the ``with`` block, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def __enter__(self) -> NativeRecording:
        if getattr(_state, "recording", None) is not None:
            raise RuntimeError("a native recording is already open on this thread")
        _state.recording = self
        return self

    def __exit__(self, *exc: object) -> None:
        _state.recording = None

    def replay(self) -> None:
        """Run every recorded call again, with the same arguments, in the same order."""
        for function, args in self.calls:
            function(*args)


def native_call(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, recorded when a ``NativeRecording`` is open on this thread."""
    result = function(*args)
    recording = getattr(_state, "recording", None)
    if recording is not None:
        recording.calls.append((function, args))
    return result
