"""DecodeGraphRunner on the CPU: padded, bucketed decode steps through eager graphs give exactly the
tokens of the plain runner, and its logprobs and KV cache up to float rounding (reference attention,
tiny random Llama); padding never touches a real request's blocks; graphs are used only where they may be."""

import pytest
import torch
from transformers import LlamaConfig

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.plugin_api import AttentionBackend, AttentionCapabilities, Platform, PlatformCapabilities, ProbeResult
from tokenmill.plugin_api.graphs import GraphCaptureDeclined
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.request import Request
from tokenmill.runner.graph_runner import (
    DecodeGraphRunner,
    EagerDecodeGraph,
    decode_buckets,
    decode_graph_factory,
)
from tokenmill.runner.model_runner import ModelRunner
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig

BLOCK_SIZE = 4
NUM_BLOCKS = 96
MAX_MODEL_LEN = 128
CONFIG = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=MAX_MODEL_LEN, initializer_range=0.15, rms_norm_eps=1e-5)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random-weight 2-layer Llama on the CPU in fp32, loaded by tokenmill's loader."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).save_pretrained(path)
    build = ModelBuildContext(dtype=torch.float32, block_size=BLOCK_SIZE, attention_backend=ReferenceAttentionBackend)
    model = build_model(LlamaConfig(**CONFIG), build)
    load_weights(model, str(path))
    return model


class CountingGraph(EagerDecodeGraph):
    """An eager graph that records every replay's batch size (into a shared list)."""

    def __init__(self, log: list[int], freeze_plan: bool = False) -> None:
        super().__init__(freeze_plan)
        self.log = log

    def replay(self) -> torch.Tensor:
        out = super().replay()
        self.log.append(out.shape[0])
        return out


def make_runner(model, backend: AttentionBackend, max_num_seqs: int = 8) -> ModelRunner:
    return ModelRunner(model, backend, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_num_batched_tokens=64,
                       max_num_seqs=max_num_seqs, max_model_len=MAX_MODEL_LEN, vocab_size=CONFIG["vocab_size"],
                       device=torch.device("cpu"))


def attach_graphs(runner: ModelRunner, max_num_seqs: int, new_graph) -> DecodeGraphRunner:
    runner.decode_graphs = DecodeGraphRunner(
        runner.model, runner.backend, runner.kv_caches, max_num_seqs=max_num_seqs,
        max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=BLOCK_SIZE, device=runner.device,
        new_graph=new_graph)
    runner.decode_graphs.capture()
    return runner.decode_graphs


MAX_TOKENS = (3, 5, 7, 9, 11, 14, 14, 14)


def requests(count: int, seed: int = 0) -> list[Request]:
    """Prompts of 3-21 tokens and 3-14 new tokens each (so decode batches shrink), with top-3 logprobs."""
    gen = torch.Generator().manual_seed(seed)
    made = []
    for i in range(count):
        prompt = torch.randint(2, CONFIG["vocab_size"], (int(torch.randint(3, 22, (1,), generator=gen)),),
                               generator=gen).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS[i], ignore_eos=True, logprobs=3)
        made.append(Request(f"r{i}", prompt, params))
    return made


def run_side_by_side(plain: ModelRunner, graphed: ModelRunner, reqs: list[Request], max_num_seqs: int = 8):
    """Drive both runners with the same scheduler steps; every step's results and caches must match."""
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                                          max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))
    for request in reqs:
        scheduler.add_request(request)
    outputs: dict[str, list[int]] = {}
    decode_sizes: list[int] = []
    while scheduler.has_unfinished_requests():
        step = scheduler.schedule()
        if all(s.num_tokens == 1 for s in step.scheduled):
            decode_sizes.append(len(step.scheduled))
        want, got = plain.execute(step), graphed.execute(step)
        assert got.sampled_token_ids == want.sampled_token_ids
        assert got.logprobs.keys() == want.logprobs.keys()
        for request_id, (entry,) in want.logprobs.items():
            (graphed_entry,) = got.logprobs[request_id]
            assert graphed_entry.token_ids == entry.token_ids and graphed_entry.ranks == entry.ranks
            # a matmul over more rows may round differently on the CPU (BLAS picks kernels by size)
            torch.testing.assert_close(graphed_entry.logprobs, entry.logprobs, atol=1e-5, rtol=0)
        for cache_plain, cache_graphed in zip(plain.kv_caches, graphed.kv_caches, strict=True):
            torch.testing.assert_close(cache_graphed[:, 1:], cache_plain[:, 1:], atol=1e-5, rtol=0)  # block 0: padding
        for update in scheduler.update(step, want.sampled_token_ids):
            outputs.setdefault(update.request.request_id, []).extend(update.new_token_ids)
    return outputs, decode_sizes


def test_buckets():
    assert decode_buckets(256) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    assert decode_buckets(100) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100)
    assert decode_buckets(6) == (1, 2, 4, 6)
    assert decode_buckets(1) == (1,)
    with pytest.raises(ValueError, match="at least 1"):
        decode_buckets(0)


def test_padded_eager_graphs_match_the_plain_runner(tiny_llama):
    replays: list[int] = []
    plain = make_runner(tiny_llama, ReferenceAttentionBackend())
    graphed = make_runner(tiny_llama, ReferenceAttentionBackend())
    graphs = attach_graphs(graphed, max_num_seqs=6, new_graph=lambda: CountingGraph(replays))
    assert graphs.buckets == (1, 2, 4, 6)
    replays.clear()  # capture ran each graph once

    outputs, decode_sizes = run_side_by_side(plain, graphed, requests(8))
    assert sorted(len(tokens) for tokens in outputs.values()) == sorted(MAX_TOKENS)
    # decode batches of 7-8 requests ran eagerly, the others through the smallest bucket that holds them
    assert {7, 8} <= set(decode_sizes) and {3, 5} <= set(decode_sizes), decode_sizes
    assert replays == [graphs.bucket_for(n) for n in decode_sizes if n <= 6]


def test_padding_rows_write_only_the_null_block(tiny_llama):
    graphed = make_runner(tiny_llama, ReferenceAttentionBackend())
    graphs = attach_graphs(graphed, max_num_seqs=8, new_graph=EagerDecodeGraph)
    before = [cache.clone() for cache in graphed.kv_caches]
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN,
                                          block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))
    for request in requests(3, seed=1):
        scheduler.add_request(request)
    step = scheduler.schedule()  # the prefills
    scheduler.update(step, graphed.execute(step).sampled_token_ids)
    step = scheduler.schedule()  # three decodes, padded to 4
    assert graphs.accepts(graphed.inputs.build(step.scheduled))
    graphed.execute(step)
    owned = {b for s in step.scheduled for b in s.block_ids}
    buffers = graphs.buffers
    assert buffers.seq_lens[3:].tolist() == [1] * 5 and buffers.slot_mapping[3:].tolist() == [0] * 5
    assert not buffers.block_tables[3:].any()
    for old, new in zip(before, graphed.kv_caches, strict=True):
        changed = {b for b in range(NUM_BLOCKS) if not torch.equal(old[:, b], new[:, b])}
        assert 0 in changed and changed - {0} <= owned


def test_graphs_take_only_decode_steps_without_prompt_logprobs_that_fit(tiny_llama):
    runner = make_runner(tiny_llama, ReferenceAttentionBackend())
    graphs = attach_graphs(runner, max_num_seqs=2, new_graph=EagerDecodeGraph)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN,
                                          block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))

    def next_step(expect_graph: bool) -> None:
        step = scheduler.schedule()
        assert graphs.accepts(runner.inputs.build(step.scheduled)) is expect_graph
        scheduler.update(step, runner.execute(step).sampled_token_ids)

    scheduler.add_request(Request("one", [7], SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=1)))
    next_step(expect_graph=False)  # one token, but it asks for prompt logprobs
    next_step(expect_graph=True)  # a plain decode
    for request in requests(2, seed=3):
        scheduler.add_request(request)
    next_step(expect_graph=False)  # a decode and two prefills
    next_step(expect_graph=False)  # three decodes: more than the largest bucket (2)


class RefusingGraph(EagerDecodeGraph):
    """A device that cannot record the forward (as CUDA refuses a forward that syncs with the host)."""

    def capture(self, plan, forward) -> None:
        super().capture(plan, forward)
        raise RuntimeError("the decode forward synchronises with the host")


def test_a_refused_capture_leaves_every_step_eager(tiny_llama, caplog):
    plain = make_runner(tiny_llama, ReferenceAttentionBackend())
    runner = make_runner(tiny_llama, ReferenceAttentionBackend())
    graphs = DecodeGraphRunner(runner.model, runner.backend, runner.kv_caches, max_num_seqs=4,
                               max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=BLOCK_SIZE,
                               device=runner.device, new_graph=RefusingGraph)
    with caplog.at_level("WARNING", logger="tokenmill"):
        assert graphs.capture() is False
    assert "decode graphs off: capturing batch size 4 failed: the decode forward synchronises" in caplog.text
    runner.decode_graphs = graphs
    scheduler_requests = requests(2, seed=4)
    outputs, decode_sizes = run_side_by_side(plain, runner, scheduler_requests)
    assert not graphs.graphs and decode_sizes and sum(map(len, outputs.values())) == sum(MAX_TOKENS[:2])


class RowLimitedGraph(EagerDecodeGraph):
    """A forward that is native (capturable) only up to two rows, as a dense CPU model's linear layers."""

    def capture(self, plan, forward) -> None:
        super().capture(plan, forward)
        if self.bucket > 2:
            raise GraphCaptureDeclined(f"{self.bucket} rows run outside a native kernel")


def test_declining_buckets_leave_the_smaller_ones_captured(tiny_llama, caplog):
    plain = make_runner(tiny_llama, ReferenceAttentionBackend())
    runner = make_runner(tiny_llama, ReferenceAttentionBackend())
    sizes = iter([8, 4, 2, 1])  # capture runs largest first

    def new_graph():
        graph = RowLimitedGraph()
        graph.bucket = next(sizes)
        return graph

    graphs = DecodeGraphRunner(runner.model, runner.backend, runner.kv_caches, max_num_seqs=8,
                               max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=BLOCK_SIZE,
                               device=runner.device, new_graph=new_graph)
    with caplog.at_level("INFO", logger="tokenmill"):
        assert graphs.capture()
    runner.decode_graphs = graphs
    assert graphs.buckets == (1, 2) and set(graphs.graphs) == {1, 2}
    assert "larger batch sizes run eagerly (batch size 4: 4 rows run outside a native kernel)" in caplog.text
    outputs, decode_sizes = run_side_by_side(plain, runner, requests(5, seed=2))
    assert any(size > 2 for size in decode_sizes) and sum(map(len, outputs.values())) == sum(MAX_TOKENS[:5])


def test_a_frozen_plan_needs_a_backend_that_declares_graph_capture(tiny_llama):
    runner = make_runner(tiny_llama, ReferenceAttentionBackend())
    with pytest.raises(ValueError, match="does not declare graph_capture"):
        attach_graphs(runner, max_num_seqs=2, new_graph=lambda: EagerDecodeGraph(freeze_plan=True))


class GraphPlatform(Platform):
    """A platform that records graphs eagerly with a frozen plan, as a capturing device would."""

    name = "graphs"
    device_type = "cpu"

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(1)

    @property
    def capabilities(self) -> PlatformCapabilities:
        return PlatformCapabilities(graph_capture=True)

    def create_graph(self) -> EagerDecodeGraph:
        return EagerDecodeGraph(freeze_plan=True)


class GraphCapableBackend(ReferenceAttentionBackend):
    name = "graph-capable"
    capabilities = AttentionCapabilities(device_types=("cpu",), graph_capture=True)


def test_factory_needs_platform_backend_and_no_enforce_eager():
    from tokenmill.reference.platform import ReferencePlatform

    platform = GraphPlatform()
    factory, reason = decode_graph_factory(platform, GraphCapableBackend, enforce_eager=False)
    assert factory is not None and factory().freezes_plan and "graph-capable" in reason
    assert decode_graph_factory(platform, GraphCapableBackend, enforce_eager=True) == (None, "disabled by enforce_eager")
    factory, reason = decode_graph_factory(platform, ReferenceAttentionBackend, enforce_eager=False)
    assert factory is None and reason == "attention backend reference does not support graph capture"
    factory, reason = decode_graph_factory(ReferencePlatform(), GraphCapableBackend, enforce_eager=False)
    assert factory is None and "cannot capture graphs" in reason
