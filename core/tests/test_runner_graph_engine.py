"""The engine builder's side of the accelerator path, on the CPU: KV-cache sizing from memory measured
after a profiling step (gpu_memory_utilization), and decode graphs captured only when the platform
and the attention backend allow it and enforce_eager is off."""

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenmill.config import EngineArgs
from tokenmill.discovery.attention_choice import AttentionChoice
from tokenmill.engine_core.config_resolver import resolve_config
from tokenmill.engine_core.core_builder import build_engine_core
from tokenmill.plugin_api import AttentionCapabilities, MemoryInfo, PlatformCapabilities
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.platform import ReferencePlatform
from tokenmill.runner.graph_runner import EagerDecodeGraph, decode_buckets
from tokenmill.runner.memory_profile import kv_cache_sizing, profile_memory_in_use, profiling_batch

MIB = 1 << 20
GIB = 1 << 30


def test_sizing_is_utilization_of_total_less_memory_in_use():
    sizing = kv_cache_sizing(MemoryInfo(total=80 * GIB, free=60 * GIB), 0.9, bytes_per_block=2 * MIB)
    assert sizing.in_use == 20 * GIB and sizing.budget == int(0.9 * 80 * GIB) - 20 * GIB
    assert sizing.num_blocks == sizing.budget // (2 * MIB) == 26624
    assert "26624 blocks" in sizing.describe() and "0.9 of 80.0 GiB" in sizing.describe()


def test_sizing_refuses_when_the_model_leaves_no_room():
    with pytest.raises(ValueError, match="raise --gpu-memory-utilization, lower --max-num-batched-tokens"):
        kv_cache_sizing(MemoryInfo(total=16 * GIB, free=7 * GIB), 0.5, bytes_per_block=MIB)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        kv_cache_sizing(MemoryInfo(total=16 * GIB, free=7 * GIB), 1.5, bytes_per_block=MIB)


def test_profiling_batch_splits_at_max_model_len_and_writes_block_zero():
    batch = profiling_batch(num_tokens=70, max_model_len=32, block_size=16, device=torch.device("cpu"))
    assert batch.query_lens_cpu == [32, 32, 6] and batch.seq_lens.tolist() == [32, 32, 6]
    assert batch.query_start_loc.tolist() == [0, 32, 64, 70] and batch.max_seq_len == 32
    assert batch.slot_mapping.max() < 16 and not batch.block_tables.any() and batch.block_tables.shape == (3, 2)


class MeasuredPlatform(ReferencePlatform):
    """The reference platform with fixed device memory and, optionally, graph capture."""

    name = "measured"

    def __init__(self, total: int = 64 * MIB, in_use: int = 16 * MIB, graph_capture: bool = False) -> None:
        super().__init__(0)
        self.memory = MemoryInfo(total=total, free=total - in_use)
        self.graph_capture = graph_capture
        self.synchronized = 0

    @property
    def capabilities(self) -> PlatformCapabilities:
        return replace(super().capabilities, graph_capture=self.graph_capture)

    def memory_info(self) -> MemoryInfo:
        return self.memory

    def synchronize(self) -> None:
        self.synchronized += 1

    def create_graph(self) -> EagerDecodeGraph:
        return EagerDecodeGraph()


class GraphCapableReference(ReferenceAttentionBackend):
    """Reference attention that claims graph capture: sound here only because eager graphs re-plan."""

    name = "reference-graphs"
    capabilities = replace(ReferenceAttentionBackend.capabilities, graph_capture=True)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    """A resolved configuration for a tiny random Llama on the CPU (4 MiB of KV cache)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama-engine")
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=256)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return resolve_config(EngineArgs(model=str(path), device="cpu", dtype="float32", kv_cache_memory="4MiB",
                                     max_num_seqs=12, max_num_batched_tokens=300))


def with_platform(config, platform, backend=ReferenceAttentionBackend, **changes):
    attention = {kind: AttentionChoice(backend.name, backend, []) for kind in config.selection.attention}
    selection = replace(config.selection, platform_instance=platform, attention=attention)
    return replace(config, selection=selection, **changes)


def test_profiled_sizing_replaces_the_estimate(tiny_config):
    platform = MeasuredPlatform(total=64 * MIB, in_use=16 * MIB)
    core = build_engine_core(with_platform(tiny_config, platform, gpu_memory_utilization=0.5))
    bytes_per_block = tiny_config.cache.bytes_per_block
    assert core.scheduler.config.num_blocks == (32 * MIB - 16 * MIB) // bytes_per_block
    assert core.runner.kv_cache_usage_bytes() == core.scheduler.config.num_blocks * bytes_per_block
    assert platform.synchronized >= 1  # the profiling step finished before memory was read
    core.shutdown()


def test_profiling_step_reads_memory_after_the_largest_step(tiny_config):
    from tokenmill.layers.context import ModelBuildContext
    from tokenmill.loader.model_loader import build_model, load_weights

    platform = MeasuredPlatform()
    model = build_model(tiny_config.model.hf_config, ModelBuildContext(dtype=torch.float32))
    load_weights(model, tiny_config.model.path)
    memory = profile_memory_in_use(model, ReferenceAttentionBackend(), platform, num_tokens=300, num_sampled=12,
                                   max_model_len=256, block_size=16)
    assert memory == platform.memory and platform.synchronized == 1


def test_too_small_a_profiled_cache_is_an_error(tiny_config):
    platform = MeasuredPlatform(total=64 * MIB, in_use=32 * MIB - 64 * 1024)  # 8 blocks of 16: < 256 tokens
    with pytest.raises(ValueError, match="lower --max-model-len or raise --gpu-memory-utilization"):
        build_engine_core(with_platform(tiny_config, platform, gpu_memory_utilization=0.5))


def test_decode_graphs_follow_platform_backend_and_enforce_eager(tiny_config):
    capable = MeasuredPlatform(graph_capture=True)
    core = build_engine_core(with_platform(tiny_config, capable, GraphCapableReference))
    assert core.runner.decode_graphs is not None and core.runner.decode_graphs.buckets == decode_buckets(12)
    assert set(core.runner.decode_graphs.graphs) == set(decode_buckets(12))
    core.shutdown()
    for config in (with_platform(tiny_config, capable, GraphCapableReference, enforce_eager=True),
                   with_platform(tiny_config, capable, ReferenceAttentionBackend),
                   with_platform(tiny_config, MeasuredPlatform(graph_capture=False), GraphCapableReference)):
        core = build_engine_core(config)
        assert core.runner.decode_graphs is None
        core.shutdown()


def test_enforce_eager_is_an_engine_argument(tiny_config):
    from tokenmill.cli.engine_flags import add_engine_flags, engine_args_from

    assert EngineArgs().enforce_eager is False and tiny_config.enforce_eager is False
    assert tiny_config.gpu_memory_utilization is None  # kv_cache_memory was given
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    assert engine_args_from(parser.parse_args(["--enforce-eager"])).enforce_eager is True
    assert AttentionCapabilities().graph_capture is False
