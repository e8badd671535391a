"""The engine core's side of /v1/embeddings, in process: an encoder-only model (tiny random BERT)
builds without KV-cache profiling or decode graphs, READY says it cannot generate, and the core's
message loop answers EMBED with the Embedder's vectors (several forwards per request), refuses
generation and empty prompts, and drops an embedding request aborted while queued. On a decoder,
embedding between steps leaves the scheduler's KV cache bit-for-bit unchanged."""

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
import zmq
from transformers import AutoModel, AutoModelForCausalLM, BertConfig, LlamaConfig

from tokenmill.config import EngineArgs
from tokenmill.discovery.attention_choice import AttentionChoice
from tokenmill.engine import messages as wire
from tokenmill.engine.config_resolver import resolve_config
from tokenmill.engine.core_builder import build_engine_core
from tokenmill.engine.core_process import EngineCoreProc, ready_message
from tokenmill.engine.embedding import Embedder
from tokenmill.engine.messages import EngineCoreEmbedRequest, EngineCoreRequest
from tokenmill.plugin_api import MemoryInfo, PlatformCapabilities
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.platform import ReferencePlatform
from tokenmill.runner.graph_runner import EagerDecodeGraph
from tokenmill.sampling_params import SamplingParams

MIB = 1 << 20
VOCAB, HIDDEN = 100, 48


@pytest.fixture(scope="module")
def bert_config(tmp_path_factory):
    """A resolved configuration for a 2-layer random BERT (max_num_batched_tokens 40: several forwards)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-bert-engine")
    config = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=80, max_position_embeddings=64)
    AutoModel.from_config(config).save_pretrained(path)
    return resolve_config(EngineArgs(model=str(path), device="cpu", dtype="float32", kv_cache_memory="4MiB",
                                     max_num_batched_tokens=40))


class MeasuredGraphPlatform(ReferencePlatform):
    """The reference platform with fixed device memory and graph capture, as an accelerator looks."""

    name = "measured"

    def __init__(self) -> None:
        super().__init__(0)
        self.memory_reads = 0

    @property
    def capabilities(self) -> PlatformCapabilities:
        return replace(super().capabilities, graph_capture=True)

    def memory_info(self) -> MemoryInfo:
        self.memory_reads += 1
        return MemoryInfo(total=64 * MIB, free=48 * MIB)

    def create_graph(self) -> EagerDecodeGraph:
        return EagerDecodeGraph()


class GraphCapableReference(ReferenceAttentionBackend):
    name = "reference-graphs"
    capabilities = replace(ReferenceAttentionBackend.capabilities, graph_capture=True)


def test_encoder_skips_kv_profiling_and_decode_graphs(bert_config):
    platform = MeasuredGraphPlatform()
    attention = {kind: AttentionChoice(GraphCapableReference.name, GraphCapableReference, [])
                 for kind in bert_config.selection.attention}
    config = replace(bert_config, gpu_memory_utilization=0.5,
                     selection=replace(bert_config.selection, platform_instance=platform, attention=attention))
    core = build_engine_core(config)  # a profiling forward or a decode-graph capture would raise TypeError
    try:
        assert platform.memory_reads == 0
        assert core.runner.kv_caches == [] and core.runner.decode_graphs is None
        ready = ready_message(config, core.runner.model)
        assert not ready.can_generate and ready.embedding_size == HIDDEN
    finally:
        core.shutdown()


def _send(socket, kind, payload):
    socket.send_multipart(wire.frame(kind, payload))


def _replies(socket, count):
    replies = []
    for _ in range(count):
        assert socket.poll(30_000), f"no reply after {replies}"
        kind, payload = socket.recv_multipart()
        if kind in (wire.EMBEDDINGS, wire.REJECTED):
            replies.append(wire.decode(kind, payload))
        else:
            raise AssertionError(f"unexpected message {kind!r}")
    return {reply.request_id: reply for reply in replies}


def test_core_loop_embeds_refuses_generation_and_drops_aborted_requests(bert_config):
    core = build_engine_core(bert_config)
    assert ready_message(bert_config, core.runner.model).can_generate is False
    context = zmq.Context()
    to_engine, engine_in = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    engine_out, from_engine = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    engine_in.bind("inproc://requests")
    to_engine.connect("inproc://requests")
    from_engine.bind("inproc://outputs")
    engine_out.connect("inproc://outputs")
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (30, 7, 25, 3, 12)]
    _send(to_engine, wire.EMBED, EngineCoreEmbedRequest("dropped", [[1, 2, 3]]))
    _send(to_engine, wire.ABORT, ["dropped"])
    _send(to_engine, wire.EMBED, EngineCoreEmbedRequest("batch", prompts))
    _send(to_engine, wire.ADD, [EngineCoreRequest("gen", [5, 6], SamplingParams(max_tokens=2))])
    _send(to_engine, wire.EMBED, EngineCoreEmbedRequest("empty", [[4], []]))
    loop = EngineCoreProc(core, bert_config, engine_in, engine_out)
    thread = threading.Thread(target=loop.run, name="engine-core-test")
    thread.start()
    try:
        replies = _replies(from_engine, 3)
        assert set(replies) == {"batch", "gen", "empty"}  # nothing for the aborted request
        assert replies["gen"].message == wire.CANNOT_GENERATE
        assert "empty prompt" in replies["empty"].message
        got = replies["batch"].vectors()
        assert got.dtype == np.float32 and got.shape == (len(prompts), HIDDEN)
        want = Embedder.for_core(core, bert_config).embed(prompts).numpy()
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # normalized CLS pooling
        assert not from_engine.poll(200)
    finally:
        _send(to_engine, wire.SHUTDOWN, [])
        thread.join(30)
        for socket in (to_engine, engine_in, engine_out, from_engine):
            socket.close(linger=0)
        context.term()
        core.shutdown()
    assert not thread.is_alive()


@pytest.fixture(scope="module")
def llama_config(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama-embed")
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=256)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return resolve_config(EngineArgs(model=str(path), device="cpu", dtype="float32", kv_cache_memory="2MiB",
                                     max_num_batched_tokens=64))


def _greedy_tokens(core, embed_between_steps=None):
    core.add_request(EngineCoreRequest("r", [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28],
                                       SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)))
    tokens = []
    while core.has_unfinished_requests():
        tokens += [t for output in core.step().outputs for t in output.new_token_ids]
        if embed_between_steps is not None:
            embed_between_steps()
    return tokens


def test_decoder_embeddings_between_steps_leave_the_kv_cache_alone(llama_config):
    core, reference = build_engine_core(llama_config), build_engine_core(llama_config)
    embedder = Embedder.for_core(core, llama_config)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (40, 33, 20, 9)]  # 2 forwards
    first = embedder.embed(prompts)

    def embed_and_compare():
        before = [cache.clone() for cache in core.runner.kv_caches]
        torch.testing.assert_close(embedder.embed(prompts), first, atol=1e-6, rtol=0)
        assert all(torch.equal(a, b) for a, b in zip(before, core.runner.kv_caches, strict=True))

    try:
        assert len(embedder.plan_batches(prompts)) == 2 and core.runner.kv_caches
        assert _greedy_tokens(core, embed_and_compare) == _greedy_tokens(reference)
    finally:
        core.shutdown()
        reference.shutdown()
