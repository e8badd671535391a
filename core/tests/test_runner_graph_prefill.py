"""PrefillGraphRunner on the CPU: one request's prefill chunks, padded to a bucket and run through eager
graphs, give the plain runner's tokens and logprobs (up to float rounding) and its KV cache, with and
without a cached prefix; padding writes only the null block; only one-request prefills without prompt
logprobs that fit the largest bucket are taken; a declined bucket runs eagerly, buckets above the
largest that captures run eagerly (found by bisection), a declined smallest and largest bucket or a
refused recording turns them all off."""

import pytest
import torch
from transformers import LlamaConfig

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.plugin_api import AttentionCapabilities, PlatformCapabilities
from tokenmill.plugin_api.graphs import GraphCaptureDeclined
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.request import Request
from tokenmill.runner.graph_runner import EagerDecodeGraph
from tokenmill.runner.model_runner import ModelRunner
from tokenmill.runner.prefill_graphs import PrefillGraphRunner, prefill_buckets
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig

BLOCK_SIZE = 4
NUM_BLOCKS = 96
MAX_MODEL_LEN = 128
MAX_TOKENS = 24
CONFIG = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=MAX_MODEL_LEN, initializer_range=0.15, rms_norm_eps=1e-5)


class PrefillCapableReference(ReferenceAttentionBackend):
    """Reference attention that claims prefill graphs: sound here only because eager graphs re-plan."""

    name = "reference-prefill-graphs"
    capabilities = AttentionCapabilities(graph_capture=True, prefill_graph_capture=True)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random-weight 2-layer Llama on the CPU in fp32, loaded by tokenmill's loader."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama-prefill")
    AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).save_pretrained(path)
    build = ModelBuildContext(dtype=torch.float32, block_size=BLOCK_SIZE, attention_backend=ReferenceAttentionBackend)
    model = build_model(LlamaConfig(**CONFIG), build)
    load_weights(model, str(path))
    return model


class LoggingGraph(EagerDecodeGraph):
    """An eager graph that logs every replay's row count (into a shared list)."""

    def __init__(self, log: list[int]) -> None:
        super().__init__()
        self.log = log

    def replay(self) -> torch.Tensor:
        out = super().replay()
        self.log.append(out.shape[0])
        return out


def make_runner(model, backend=None) -> ModelRunner:
    return ModelRunner(model, backend or PrefillCapableReference(), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                       max_num_batched_tokens=64, max_num_seqs=4, max_model_len=MAX_MODEL_LEN,
                       vocab_size=CONFIG["vocab_size"], device=torch.device("cpu"))


def attach(runner: ModelRunner, new_graph) -> PrefillGraphRunner:
    runner.prefill_graphs = PrefillGraphRunner(
        runner.model, runner.backend, runner.kv_caches, max_tokens=MAX_TOKENS,
        max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=BLOCK_SIZE, device=runner.device,
        new_graph=new_graph)
    return runner.prefill_graphs


def scheduler(chunk: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=chunk, max_model_len=MAX_MODEL_LEN,
                                     block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, enable_prefix_caching=True,
                                     enable_chunked_prefill=True))


def serve_one_by_one(plain: ModelRunner, graphed: ModelRunner, prompts: list[list[int]], chunk: int = 64):
    """Each prompt alone (prefill, then 3 decodes), both runners on the same steps; results must match."""
    sched = scheduler(chunk)
    prefill_lengths = []
    for index, prompt in enumerate(prompts):
        sched.add_request(Request(f"r{index}", prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                                                       logprobs=2)))
        while sched.has_unfinished_requests():
            step = sched.schedule()
            if step.scheduled and step.scheduled[0].num_tokens > 1:
                prefill_lengths.append(step.scheduled[0].num_tokens)
            want, got = plain.execute(step), graphed.execute(step)
            assert got.sampled_token_ids == want.sampled_token_ids
            for request_id, (entry,) in want.logprobs.items():
                (graphed_entry,) = got.logprobs[request_id]
                assert graphed_entry.token_ids == entry.token_ids
                torch.testing.assert_close(graphed_entry.logprobs, entry.logprobs, atol=1e-5, rtol=0)
            for cache_plain, cache_graphed in zip(plain.kv_caches, graphed.kv_caches, strict=True):
                torch.testing.assert_close(cache_graphed[:, 1:], cache_plain[:, 1:], atol=1e-5, rtol=0)
            sched.update(step, want.sampled_token_ids)
    return prefill_lengths


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(2, CONFIG["vocab_size"], (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_buckets():
    assert prefill_buckets(128) == (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
    assert prefill_buckets(100) == (8, 16, 24, 32, 40, 48, 56, 64, 80, 96)
    assert prefill_buckets(20) == (8, 16)
    with pytest.raises(ValueError, match="at least 8 tokens"):
        prefill_buckets(7)


def test_padded_prefills_match_the_plain_runner(tiny_llama):
    replays: list[int] = []
    plain, graphed = make_runner(tiny_llama), make_runner(tiny_llama)
    graphs = attach(graphed, lambda: LoggingGraph(replays))
    assert graphs.buckets == (8, 16, 24) and graphs.capture() and set(graphs.graphs) == {8, 16, 24}
    replays.clear()
    shared = prompt(12, seed=9)
    prompts = [prompt(5, 1), prompt(8, 2), prompt(17, 3), prompt(24, 4), shared + prompt(6, 5), shared + prompt(9, 6),
               prompt(40, 7)]
    lengths = serve_one_by_one(plain, graphed, prompts)
    # the second prompt sharing 12 tokens (3 cached blocks) prefills its other 9 after that context
    assert lengths == [5, 8, 17, 24, 18, 9, 40], lengths
    taken = [n for n in lengths if n <= MAX_TOKENS]
    assert [r for r in replays if r > 1] == [graphs.bucket_for(n) for n in taken]


def test_chunks_of_a_long_prompt_take_the_graph_when_they_fit(tiny_llama):
    replays: list[int] = []
    plain, graphed = make_runner(tiny_llama), make_runner(tiny_llama)
    attach(graphed, lambda: LoggingGraph(replays)).capture()
    replays.clear()
    lengths = serve_one_by_one(plain, graphed, [prompt(50, 11)], chunk=20)
    assert lengths == [20, 20, 10] and [r for r in replays if r > 1] == [24, 24, 16]


def test_padding_writes_only_the_null_block(tiny_llama):
    graphed = make_runner(tiny_llama)
    graphs = attach(graphed, EagerDecodeGraph)
    graphs.capture()
    before = [cache.clone() for cache in graphed.kv_caches]
    sched = scheduler()
    sched.add_request(Request("one", prompt(13, 21), SamplingParams(max_tokens=1, ignore_eos=True)))
    step = sched.schedule()
    assert graphs.accepts(graphed.inputs.build(step.scheduled))
    graphed.execute(step)
    buffers = graphs.buffers
    assert buffers.query_start_loc.tolist() == [0, 13, 16] and buffers.context_lens.tolist() == [0, 0]
    assert buffers.slot_mapping[13:16].tolist() == [0, 0, 0] and not buffers.block_tables[1].any()
    owned = set(step.scheduled[0].block_ids)
    for old, new in zip(before, graphed.kv_caches, strict=True):
        changed = {b for b in range(NUM_BLOCKS) if not torch.equal(old[:, b], new[:, b])}
        assert changed - {0} == owned


def test_only_single_request_prefills_without_prompt_logprobs_that_fit(tiny_llama):
    runner = make_runner(tiny_llama)
    graphs = attach(runner, EagerDecodeGraph)
    graphs.capture()
    sched = scheduler()

    def accepted(requests) -> bool:
        for request in requests:
            sched.add_request(request)
        step = sched.schedule()
        taken = graphs.accepts(runner.inputs.build(step.scheduled))
        sched.finish_requests([s.request_id for s in step.scheduled], _aborted())
        return taken

    assert accepted([Request("a", prompt(10, 1), SamplingParams(max_tokens=2))])
    assert not accepted([Request("b", prompt(10, 2), SamplingParams(max_tokens=2, prompt_logprobs=1))])
    assert not accepted([Request("c", prompt(10, 3), SamplingParams(max_tokens=2)),
                         Request("d", prompt(10, 4), SamplingParams(max_tokens=2))])
    assert not accepted([Request("e", prompt(30, 5), SamplingParams(max_tokens=2))])  # past the largest bucket
    assert not accepted([Request("f", prompt(1, 6), SamplingParams(max_tokens=2))])  # one token: a decode's shape


def _aborted():
    from tokenmill.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


class SmallDeclines(EagerDecodeGraph):
    """A graph that cannot record forwards of fewer than ``rows`` rows (a kernel native only past a size)."""

    rows = 16

    def capture(self, plan, forward) -> None:
        super().capture(plan, forward)
        if forward(plan()).shape[0] < self.rows:
            raise GraphCaptureDeclined(f"a kernel below {self.rows} rows is not native")


def test_a_declined_bucket_runs_eagerly(tiny_llama, caplog):
    plain, graphed = make_runner(tiny_llama), make_runner(tiny_llama)
    graphs = attach(graphed, SmallDeclines)
    with caplog.at_level("INFO", logger="tokenmill"):
        assert graphs.capture()
    assert "prefill graph for 8 tokens declined, runs eagerly: a kernel below 16 rows" in caplog.text
    assert set(graphs.graphs) == {16, 24} and set(graphs.declined) == {8}
    step_lengths = serve_one_by_one(plain, graphed, [prompt(6, 31), prompt(20, 33)])
    assert step_lengths == [6, 20]


class LargestDeclines(SmallDeclines):
    rows = 100


class LargeDeclines(EagerDecodeGraph):
    """Declines above 16 rows, like a kernel that takes a GEMM route for long prefills."""

    captured: list[int] = []

    def capture(self, plan, forward) -> None:
        rows = forward(plan()).shape[0]
        type(self).captured.append(rows)
        if rows > 16:
            raise GraphCaptureDeclined("a kernel above 16 rows is not native")
        super().capture(plan, forward)


def test_buckets_above_the_largest_that_captures_run_eagerly(tiny_llama, caplog):
    """The largest bucket declines, the smallest captures: a bisection finds the largest that
    captures, and every bucket up to it is captured once."""
    plain, graphed = make_runner(tiny_llama), make_runner(tiny_llama)
    graphed.prefill_graphs = PrefillGraphRunner(
        graphed.model, graphed.backend, graphed.kv_caches, max_tokens=64,
        max_blocks_per_seq=graphed.inputs.max_blocks_per_seq, block_size=BLOCK_SIZE, device=graphed.device,
        new_graph=LargeDeclines)
    graphs = graphed.prefill_graphs
    LargeDeclines.captured.clear()
    with caplog.at_level("INFO", logger="tokenmill"):
        assert graphs.capture()
    assert set(graphs.graphs) == {8, 16} and set(graphs.declined) == {24, 32, 40, 48, 56, 64}
    assert LargeDeclines.captured == [64, 8, 32, 16, 24]  # largest, smallest, then the bisection
    assert graphs.declined[64] == "a kernel above 16 rows is not native"
    assert graphs.declined[40] == "larger than 16 tokens, the largest that captures"
    step_lengths = serve_one_by_one(plain, graphed, [prompt(6, 31), prompt(20, 33), prompt(14, 35)])
    assert step_lengths == [6, 20, 14]


class DeviceRefuses(EagerDecodeGraph):
    def capture(self, plan, forward) -> None:
        raise RuntimeError("the forward synchronises with the host")


def test_a_declined_largest_bucket_or_a_refused_recording_turns_them_off(tiny_llama, caplog):
    runner = make_runner(tiny_llama)
    with caplog.at_level("INFO", logger="tokenmill"):
        assert attach(runner, LargestDeclines).capture() is False
        assert attach(runner, DeviceRefuses).capture() is False
    assert "prefill graphs off: 24 tokens: a kernel below 100 rows is not native" in caplog.text
    assert "prefill graphs off: capturing 24 tokens failed: the forward synchronises with the host" in caplog.text


def test_a_backend_without_prefill_plans_turns_them_off(tiny_llama, caplog):
    runner = make_runner(tiny_llama, ReferenceAttentionBackend())
    with caplog.at_level("INFO", logger="tokenmill"):
        assert attach(runner, EagerDecodeGraph).capture() is False
    assert "prefill graphs off: attention backend reference cannot replay a prefill plan" in caplog.text
    assert AttentionCapabilities().prefill_graph_capture is False
    assert PlatformCapabilities(dtypes=("float32",)).prefill_graph_max_tokens == 0


def test_deferred_buckets_run_eagerly_until_captured_while_idle(tiny_llama, caplog):
    replays: list[int] = []
    plain, graphed = make_runner(tiny_llama), make_runner(tiny_llama)
    graphs = attach(graphed, lambda: LoggingGraph(replays))
    with caplog.at_level("INFO", logger="tokenmill"):
        assert graphs.capture(defer=True)
    assert set(graphs.graphs) == {24} and graphs.pending == [16, 8]
    assert "2 smaller ones follow while the engine is idle" in caplog.text
    replays.clear()
    assert serve_one_by_one(plain, graphed, [prompt(6, 41), prompt(20, 43)]) == [6, 20]
    assert [r for r in replays if r > 1] == [24]  # the 6-token prefill ran eagerly: its bucket waits
    assert graphed.capture_next_graph() is True and set(graphs.graphs) == {16, 24}
    assert graphed.capture_next_graph() is False and set(graphs.graphs) == {8, 16, 24} and not graphs.pending
    assert graphed.capture_next_graph() is False
    replays.clear()
    assert serve_one_by_one(plain, graphed, [prompt(6, 45)]) == [6]
    assert [r for r in replays if r > 1] == [8]


def test_idle_work_captures_the_deferred_graphs_then_backs_the_kv_cache(tiny_llama, caplog):
    runner = make_runner(tiny_llama)
    graphs = attach(runner, lambda: LoggingGraph([]))
    assert graphs.capture(defer=True) and graphs.pending == [16, 8]
    assert runner.kv_pages.backed == 0 or runner.kv_pages.done  # done at once where the kernel cannot back pages
    backs = not runner.kv_pages.done
    turns = 0
    with caplog.at_level("INFO", logger="tokenmill"):
        while runner.work_while_idle():
            turns += 1
    assert not graphs.pending and runner.kv_pages.done and turns == 1  # 16, then 8 and the (small) cache
    assert ("backed the whole KV cache" in caplog.text) is backs
    assert runner.work_while_idle() is False
