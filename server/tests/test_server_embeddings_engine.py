"""The engine core's side of /v1/embeddings, in process: an encoder-only model (tiny random BERT)
builds without KV-cache profiling or decode graphs, READY says it cannot generate, and the core's
message loop answers EMBED with the vectors of its prompts run as pooling requests of the scheduler
(several prompts a step, several steps a request), refuses generation and empty prompts, and drops an
embedding request aborted while queued. On a decoder, prompts embedded in the same steps as a
generating request, in prefill chunks, give the vectors they get alone and leave its tokens unchanged."""

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
import zmq
from transformers import AutoModel, AutoModelForCausalLM, BertConfig, LlamaConfig

from tokenmill import wire
from tokenmill.config import EngineArgs
from tokenmill.discovery.attention_choice import AttentionChoice
from tokenmill.engine_core.config_resolver import resolve_config
from tokenmill.engine_core.core_builder import build_engine_core
from tokenmill.engine_core.core_process import EngineCoreProc, ready_message
from tokenmill.engine_core.embedding import model_pooling
from tokenmill.layers.pooling import pool
from tokenmill.plugin_api import MemoryInfo, PlatformCapabilities
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.platform import ReferencePlatform
from tokenmill.runner.graph_runner import EagerDecodeGraph
from tokenmill.sampling_params import SamplingParams
from tokenmill.wire import EngineCoreEmbedRequest, EngineCoreRequest

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


def _alone(core, config, prompts):
    """Each prompt's embedding from its own encoder pass (the model's dense path, no engine)."""
    model, pooling = core.runner.model, model_pooling(core.runner.model, config.model.path)
    rows = []
    with torch.inference_mode():
        for prompt in prompts:
            hidden = model.embed_hidden(torch.tensor(prompt), torch.arange(len(prompt)), [len(prompt)])
            rows.append(pool(hidden, [len(prompt)], pooling)[0].numpy())
    return np.stack(rows)


def test_encoder_prompts_share_steps_whole(bert_config):
    core = build_engine_core(bert_config)
    try:
        prompts = [[1] * 30, [2] * 7, [3] * 64, [4] * 3]  # 64 = max_model_len, past max_num_batched_tokens (40)
        core.add_embedding("e", prompts, model_pooling(core.runner.model, bert_config.model.path))
        steps = []
        while core.has_unfinished_requests():
            scheduled = core.scheduler.schedule()
            steps.append([s.num_tokens for s in scheduled.scheduled])
            core.scheduler.update(scheduled, {})  # nothing to run: only the plan is checked here
        assert steps == [[30, 7], [64], [3]]  # whole prompts, several a step, a long one alone
    finally:
        core.shutdown()


def _send(socket, kind, payload):
    socket.send_multipart(wire.frame(kind, payload))


def _replies(socket, count):
    replies = []
    while len(replies) < count:
        assert socket.poll(30_000), f"no reply after {replies}"
        kind, payload = socket.recv_multipart()
        if kind == wire.OUTPUTS:  # the steps that ran the pooling requests: scheduler counters, no tokens
            assert not wire.decode(kind, payload).outputs
        elif kind == wire.EMBEDDINGS:
            replies.append(wire.decode(kind, payload))
        elif kind == wire.REJECTED:
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
        np.testing.assert_allclose(got, _alone(core, bert_config, prompts), atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # normalized CLS pooling
        while from_engine.poll(200):  # nothing else but counters
            kind, payload = from_engine.recv_multipart()
            assert kind == wire.OUTPUTS and not wire.decode(kind, payload).outputs
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


def test_decoder_embeddings_in_chunks_beside_generation(llama_config):
    core, reference = build_engine_core(llama_config), build_engine_core(llama_config)
    pooling = model_pooling(core.runner.model, llama_config.model.path)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (40, 33, 20, 9)]  # 64-token steps

    def embed(engine_core, request_id):
        engine_core.add_embedding(request_id, prompts, pooling)
        rows = {}
        while request_id not in rows:
            engine_core.step()
            rows.update(engine_core.take_embeddings())
        return rows[request_id]

    try:
        alone = embed(reference, "alone")
        beside = {}
        added = []

        def embed_once():  # after the generating request's first step: its decodes share steps with the chunks
            if not added:
                core.add_embedding("beside", prompts, pooling)
                added.append(True)
            beside.update(core.take_embeddings())

        assert _greedy_tokens(core, embed_once) == _greedy_tokens(reference)
        while "beside" not in beside:
            core.step()
            beside.update(core.take_embeddings())
        np.testing.assert_allclose(beside["beside"], alone, atol=1e-5)
        assert core.scheduler.kv_cache_manager.usage() == 0.0  # every pooling request's blocks are free again
    finally:
        core.shutdown()
        reference.shutdown()
