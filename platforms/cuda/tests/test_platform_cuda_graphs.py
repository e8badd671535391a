"""CudaPlatform.create_graph and CudaDecodeGraph: one shared memory pool per platform; on a real GPU
a captured forward replays on new buffer contents with the plan made once at capture."""

from __future__ import annotations

import pytest
import torch

from tokenmill_cuda.cuda_graph import CudaDecodeGraph
from tokenmill_cuda.platform import CudaPlatform


def test_graphs_of_one_platform_share_a_pool(simulated_cuda, monkeypatch):
    simulated_cuda.devices(1)
    handles = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(handles))
    platform, other = CudaPlatform(0), CudaPlatform(0)
    first, second = platform.create_graph(), platform.create_graph()
    assert isinstance(first, CudaDecodeGraph) and first.freezes_plan
    assert first.pool == second.pool == 0 and other.create_graph().pool == 1
    assert first.device == torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="before capture"):
        first.replay()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_capture_plans_once_and_replays_on_new_inputs():
    platform = CudaPlatform(0)
    platform.activate()
    graph = platform.create_graph()
    static = torch.zeros(8, device="cuda")
    plans = []

    def plan():
        plans.append(1)
        return torch.arange(8, device="cuda", dtype=torch.float32)

    graph.capture(plan, lambda offsets: static * 2 + offsets)
    for value in (1.0, 5.0):
        static.fill_(value)
        out = graph.replay()
        torch.testing.assert_close(out, value * 2 + torch.arange(8, device="cuda", dtype=torch.float32))
    assert len(plans) == 1


def test_capture_keeps_the_plan_alive(monkeypatch):
    """A recorded graph reads the plan's tensors by address: once capture() returns, nothing but the
    graph may hold them, and freeing them would let the caching allocator reuse their memory."""
    import contextlib
    import gc
    import weakref

    class Recorded:
        def replay(self):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: type("S", (), {"wait_stream": lambda *a: None})())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"wait_stream": lambda *a: None})())
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Recorded)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())

    class Plan:
        pass

    graph = CudaDecodeGraph(torch.device("cuda", 0), pool=None)
    plans: list[weakref.ref] = []

    def plan():
        made = Plan()
        plans.append(weakref.ref(made))
        return made

    graph.capture(plan, lambda metadata: torch.zeros(2))
    gc.collect()
    assert len(plans) == 1 and plans[0]() is not None
