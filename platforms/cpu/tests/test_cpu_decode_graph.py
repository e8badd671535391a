"""CpuDecodeGraph on its own: a forward of native calls over static buffers is recorded and replayed on
the buffers' new contents (same output tensor, same results as running the forward again); any
PyTorch operation besides allocations and views declines the capture; native_call records only
inside a recording; replays run from C (CallList) where the calls fit its prototype, else from Python;
graphs sharing an ActivationArena hold one largest forward's memory."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tokenmill.plugin_api.graphs import GraphCaptureDeclined
from tokenmill.plugin_api.native import NativeRecording, native_call
from tokenmill_cpu.call_list import MAX_INTS, CallList, unavailable_reason
from tokenmill_cpu.capabilities import GRAPH_MAX_BATCH, PREFILL_GRAPH_MAX_TOKENS
from tokenmill_cpu.decode_graph import ActivationArena, CpuDecodeGraph
from tokenmill_cpu.layer_kernels import CpuLayerKernels, layer_ops_unavailable
from tokenmill_cpu.platform import CpuPlatform

pytestmark = pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the layer kernels")


class NativeStep:
    """Embedding lookup, residual add + RMSNorm, gated activation: native calls on static ids."""

    def __init__(self, rows: int = 4) -> None:
        torch.manual_seed(0)
        self.kernels = CpuLayerKernels()
        self.table = torch.randn(30, 16)
        self.residual = torch.randn(rows, 8)
        self.weight = torch.rand(8) + 0.5
        self.ids = torch.zeros(rows, dtype=torch.int64)  # the static input buffer

    def forward(self, metadata: object = None) -> torch.Tensor:
        gate_up = self.kernels.gather_rows(self.table, self.ids)
        hidden = self.kernels.silu_and_mul(gate_up)
        normed, _ = self.kernels.rms_norm(hidden, self.weight, 1e-5, self.residual)
        return normed.view(-1, 2, 8)


def test_replay_reruns_the_calls_on_the_buffers_new_contents():
    step = NativeStep()
    graph = CpuDecodeGraph()
    graph.capture(lambda: None, step.forward)
    assert graph.num_calls == 3
    first = graph.replay()
    for ids in ([1, 2, 3, 4], [29, 0, 29, 7]):
        step.ids.copy_(torch.tensor(ids))
        out = graph.replay()
        assert out is first  # one output buffer, overwritten by every replay
        assert torch.equal(out, step.forward())


def test_graphs_sharing_an_arena_keep_one_largest_forward_and_stay_right():
    arena = ActivationArena()
    large, small = NativeStep(rows=64), NativeStep(rows=4)
    graphs = [CpuDecodeGraph(arena), CpuDecodeGraph(arena)]
    graphs[0].capture(lambda: None, large.forward)
    held = arena.nbytes
    graphs[1].capture(lambda: None, small.forward)
    assert arena.nbytes == held > 0  # the small forward's allocations fit in the large one's slots
    for step, ids in ((large, torch.arange(64) % 30), (small, torch.tensor([3, 1, 4, 1])),
                      (large, torch.arange(64).flip(0) % 30)):
        step.ids.copy_(ids)
        out = graphs[0 if step is large else 1].replay()
        assert torch.equal(out, step.forward())
    grown = arena.place(0, torch.empty(1 << 20))  # a larger allocation grows its slot ...
    assert grown.shape == (1 << 20,) and arena.nbytes > held
    assert torch.equal(graphs[1].replay(), small.forward())  # ... and the graphs keep the one they use


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_replays_run_from_c_with_the_results_of_the_python_replay():
    step = NativeStep(rows=16)
    graph = CpuDecodeGraph()
    graph.capture(lambda: None, step.forward)
    assert graph.replayed_from == "C" and graph._call_list.count == graph.num_calls == 3
    step.ids.copy_(torch.arange(16) * 7 % 30)
    from_c = graph.replay().clone()
    graph._recording.replay()
    assert torch.equal(graph._output, from_c) and torch.equal(from_c, step.forward())


def test_the_call_list_takes_only_what_its_prototype_carries(monkeypatch):
    kernels = CpuLayerKernels()
    gather = kernels._library.gather_rows
    table, ids, out = torch.arange(6.0).view(3, 2), torch.tensor([2]), torch.empty(1, 2)
    args = (table.data_ptr(), 3, 8, ids.data_ptr(), 1, out.data_ptr())
    if unavailable_reason() is None:
        assert isinstance(CallList.build([(gather, args)]), CallList)
    assert "not a ctypes function" in CallList.build([(lambda *a: None, args)])
    wide = ctypes.CDLL(None).printf  # any C function will do: it is never called
    wide.argtypes = [ctypes.c_int64] * (MAX_INTS + 1)
    assert "more than 20 integer" in CallList.build([(wide, tuple(range(MAX_INTS + 1)))])
    wide.argtypes = [ctypes.c_double]
    assert "takes a c_double argument 1.5" in CallList.build([(wide, (1.5,))])
    monkeypatch.setenv("TOKENMILL_CPU_CALL_LIST", "0")
    assert CallList.build([(gather, args)]) == "TOKENMILL_CPU_CALL_LIST=0"
    graph = CpuDecodeGraph()
    graph.capture(lambda: None, NativeStep().forward)
    assert graph.replayed_from == "Python (TOKENMILL_CPU_CALL_LIST=0)" and graph.replay() is graph._output


def test_torch_operations_decline_the_capture():
    step = NativeStep()

    def with_an_add(metadata):
        return step.forward(metadata) + 1

    with pytest.raises(GraphCaptureDeclined, match="aten.add.Tensor outside a native kernel"):
        CpuDecodeGraph().capture(lambda: None, with_an_add)
    with pytest.raises(GraphCaptureDeclined, match="no native calls"):
        CpuDecodeGraph().capture(lambda: None, lambda metadata: step.table[:2].view(-1))
    with pytest.raises(RuntimeError, match="before capture"):
        CpuDecodeGraph().replay()


def test_native_call_records_only_inside_a_recording():
    kernels = CpuLayerKernels()
    function = kernels._library.gather_rows
    table, ids = torch.arange(6.0).view(3, 2), torch.tensor([2])
    out = torch.empty(1, 2)
    args = (table.data_ptr(), 3, 8, ids.data_ptr(), 1, out.data_ptr())
    assert native_call(function, *args) == 0 and out.tolist() == [[4.0, 5.0]]
    with NativeRecording() as recording:
        native_call(function, *args)
        with pytest.raises(RuntimeError, match="already open"), NativeRecording():
            pass
    assert recording.calls == [(function, args)]
    out.zero_()
    recording.replay()
    assert out.tolist() == [[4.0, 5.0]]


def test_the_platform_offers_graphs_for_small_batches():
    platform = CpuPlatform()
    assert platform.capabilities.graph_capture and platform.capabilities.graph_max_batch == GRAPH_MAX_BATCH
    first, second = platform.create_graph(), platform.create_graph()
    assert isinstance(first, CpuDecodeGraph) and first._arena is second._arena is not None
    assert platform.capabilities.prefill_graph_max_tokens == PREFILL_GRAPH_MAX_TOKENS
