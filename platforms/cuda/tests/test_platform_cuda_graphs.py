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
