"""CudaDecodeGraph: one decode batch size recorded as a torch.cuda.CUDAGraph and replayed.

Implements the DecodeGraph contract of ``tokenmill.plugin_api.graphs``: ``capture(plan, forward)``
plans attention once, runs ``forward`` eagerly on a side stream (Triton compiles its kernels and
backends build their host-side plan state there, outside the capture), then records it; ``replay``
relaunches the recorded kernels on whatever the static input buffers hold and returns the same
output tensor every time (valid until the next replay of any graph sharing the pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WARMUP_RUNS = 2


class CudaDecodeGraph:
    """A recorded decode forward. Graphs of one engine share ``pool`` so captures reuse memory."""

    freezes_plan = True

    def __init__(self, device: Any, pool: Any) -> None:
        self.device = device
        self.pool = pool
        self._graph: Any = None
        self._output: Any = None
        self._metadata: Any = None

    def capture(self, plan: Callable[[], Any], forward: Callable[[Any], Any]) -> None:
        """Plan once, warm up eagerly on a side stream, then record ``forward(plan)``.

        The second warm-up runs with torch's sync debug mode set to "error", so a forward that
        synchronises with the host (``.item()``, ``.tolist()``, data-dependent shapes) fails here
        with a RuntimeError, before any capture has begun, instead of corrupting a capture."""
        import torch

        metadata = plan()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            forward(metadata)  # compiles and autotunes kernels, which may synchronise
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                for _ in range(WARMUP_RUNS - 1):
                    forward(metadata)
            except RuntimeError as error:
                raise RuntimeError(f"the decode forward synchronises with the host, so it cannot be captured: "
                                   f"{error}") from error
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = forward(metadata)
        # the recorded kernels read the plan's tensors by address: they must live as long as the graph,
        # or the caching allocator hands their memory to the next allocation
        self._graph, self._output, self._metadata = graph, output, metadata

    def replay(self) -> Any:
        """Relaunch the recorded kernels; returns the captured output tensor, now refreshed."""
        if self._graph is None:
            raise RuntimeError("replay() before capture()")
        self._graph.replay()
        return self._output
