"""build_engine_core: turn a resolved EngineConfig into a running EngineCore (model loaded, cache allocated)."""

from __future__ import annotations

import atexit
import gc
import logging
import time
from typing import Any

import torch

from tokenmill.config import EngineConfig
from tokenmill.discovery import build_plugin_manager, discover
from tokenmill.engine_core.engine_core import EngineCore
from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import load_model
from tokenmill.runner.graph_runner import DecodeGraphRunner, decode_graph_factory
from tokenmill.runner.memory_profile import kv_cache_sizing, profile_memory_in_use
from tokenmill.runner.model_runner import ModelRunner
from tokenmill.runner.prefill_graphs import PREFILL_BUCKET_STEP, PrefillGraphRunner
from tokenmill.scheduler.config import SchedulerConfig
from tokenmill.scheduler.scheduler import Scheduler
from tokenmill.spec_decode.draft_loader import load_draft_model
from tokenmill.spec_decode.draft_model_proposer import DraftModelProposer
from tokenmill.spec_decode.ngram_proposer import NgramProposer
from tokenmill.structured.grammar_compiler import StructuredOutputCompiler

logger = logging.getLogger("tokenmill")


def build_engine_core(config: EngineConfig, defer_graph_capture: bool = False) -> EngineCore:
    """Load the model on the selected platform, allocate the KV cache, and wire the scheduler. With
    ``defer_graph_capture`` (a server, which answers sooner) only the largest prefill graph is captured
    now and the caller captures the others while idle (``ModelRunner.work_while_idle``). Either way the
    first GiB of the KV cache is backed now; a server backs the rest while idle."""
    selection = config.selection
    platform = selection.platform_instance
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    platform.seed(config.seed)
    attention = selection.attention.get("full_attention") or next(iter(selection.attention.values()))
    backend = attention.backend_cls(platform.torch_device())
    build = ModelBuildContext.for_platform(
        platform, dtype=config.model.dtype, quantizer=selection.quantizer_instance, block_size=config.cache.block_size,
        kv_cache_dtype=config.cache.kv_cache_dtype, attention_backend=attention.backend_cls)

    started = time.perf_counter()
    model = load_model(config.model.hf_config, config.model.path, build)
    layer_kernels = build.layer_kernels.name if build.layer_kernels is not None else "torch"
    logger.info("loaded %s (%s, %s) in %.1f s; linear kernels: %s; norm/rotary/activation kernels: %s",
                config.model.architecture, config.model.dtype, config.model.quantization,
                time.perf_counter() - started, build.kernel_summary(), layer_kernels)

    encoder = model.is_encoder  # embeds whole sequences: no KV cache, no decode steps
    num_blocks = _profiled_num_blocks(config, model, backend) if config.gpu_memory_utilization and not encoder \
        else config.cache.num_blocks
    # an encoder's prompt runs whole in one step (its attention is bidirectional), so any prompt must fit one
    step_tokens = max(config.max_num_batched_tokens, config.model.max_model_len) if encoder \
        else config.max_num_batched_tokens
    runner = ModelRunner(model, backend, num_blocks=num_blocks, block_size=config.cache.block_size,
                         max_num_batched_tokens=step_tokens, max_num_seqs=config.max_num_seqs,
                         max_model_len=config.model.max_model_len, vocab_size=config.model.vocab_size,
                         device=platform.torch_device(), layer_kernels=build.layer_kernels, platform=platform)
    speculative = config.speculative
    if speculative is not None and encoder:
        raise ValueError(f"{config.model.architecture} embeds sequences and generates nothing: speculative "
                         f"decoding does not apply")
    if not encoder:
        _attach_graphs(config, runner, defer_graph_capture)
        runner.prepare_greedy_head(config.model.hidden_size, build.dtype)
    runner.back_kv_cache()
    if speculative is not None:
        runner.proposer = _proposer(config, runner, attention.backend_cls)
    num_speculative_tokens = speculative.num_speculative_tokens if speculative is not None else 0
    scheduler = Scheduler(SchedulerConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=step_tokens,
        max_model_len=config.model.max_model_len, block_size=config.cache.block_size,
        num_blocks=num_blocks, enable_prefix_caching=config.cache.enable_prefix_caching and not encoder,
        enable_chunked_prefill=config.enable_chunked_prefill and not encoder, policy=config.scheduling_policy,
        num_lookahead_tokens=num_speculative_tokens))
    hooks = build_plugin_manager(discover()).hook
    hooks.on_engine_start(engine_info={
        "platform": platform.name, "device": str(platform.torch_device()), "model": config.model.path,
        "dtype": config.model.dtype, "kv_cache_blocks": num_blocks, "block_size": config.cache.block_size})
    grammars = None if encoder else StructuredOutputCompiler(config.model.tokenizer_path, config.model.vocab_size,
                                                             config.model.eos_token_ids)
    core = EngineCore(scheduler, runner, on_request_finished=hooks.on_request_finished,
                      on_stop=hooks.on_engine_stop, num_speculative_tokens=num_speculative_tokens, grammars=grammars)
    _freeze_survivors()
    return core


def _freeze_survivors() -> None:
    """Move what is alive now (modules, graphs, tokenizer: ~380k objects for SmolLM2) out of the garbage
    collector's generations, so the full collections that steps' garbage triggers stop traversing it
    (3-4 % of a 64-request run). EngineCore.shutdown unfreezes, and so does interpreter exit, where
    extension modules (triton's nanobind) report objects still frozen as leaks."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)
    atexit.register(gc.unfreeze)


def _proposer(config: EngineConfig, runner: ModelRunner, attention_backend: type) -> NgramProposer | DraftModelProposer:
    """The drafter ``config.speculative`` asks for; a draft model gets decode graphs where the target has them."""
    spec = config.speculative
    if spec.method == "ngram":
        return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    platform = config.selection.platform_instance
    draft = load_draft_model(spec, platform, target=runner.model, target_path=config.model.path,
                             dtype=config.model.dtype, block_size=config.cache.block_size,
                             kv_cache_dtype=config.cache.kv_cache_dtype, attention_backend=attention_backend)
    proposer = DraftModelProposer(draft, runner.backend, runner.kv_caches,
                                  num_speculative_tokens=spec.num_speculative_tokens, max_num_seqs=config.max_num_seqs,
                                  max_blocks_per_seq=runner.inputs.max_blocks_per_seq,
                                  block_size=config.cache.block_size, device=runner.device, greedy=runner.greedy)
    if runner.decode_graphs is not None:
        graphs = DecodeGraphRunner(draft, runner.backend, runner.kv_caches, max_num_seqs=runner.decode_graphs.buckets[-1],
                                   max_blocks_per_seq=runner.inputs.max_blocks_per_seq,
                                   block_size=config.cache.block_size, device=runner.device,
                                   new_graph=config.selection.platform_instance.create_graph)
        if graphs.capture():
            proposer.graphs = graphs
    return proposer


def _profiled_num_blocks(config: EngineConfig, model: Any, backend: Any) -> int:
    """KV-cache blocks that fit under ``gpu_memory_utilization`` once the model is loaded and the
    largest step has run (replaces the resolver's estimate from the checkpoint's size)."""
    platform = config.selection.platform_instance
    memory = profile_memory_in_use(model, backend, platform, num_tokens=config.max_num_batched_tokens,
                                   num_sampled=config.max_num_seqs, max_model_len=config.model.max_model_len,
                                   block_size=config.cache.block_size)
    sizing = kv_cache_sizing(memory, config.gpu_memory_utilization, config.cache.bytes_per_block)
    capacity = (sizing.num_blocks - 1) * config.cache.block_size
    if capacity < config.model.max_model_len:
        raise ValueError(f"after profiling, the KV cache holds {capacity} tokens, fewer than max_model_len="
                         f"{config.model.max_model_len}: lower --max-model-len or raise --gpu-memory-utilization")
    logger.info("%s (estimated before loading: %d blocks)", sizing.describe(), config.cache.num_blocks)
    return sizing.num_blocks


def _attach_graphs(config: EngineConfig, runner: ModelRunner, defer: bool = False) -> None:
    """Capture decode graphs, and prefill graphs where the platform offers them, when the platform and
    attention backend allow it and enforce_eager is off. The largest prefill graph goes first: on a
    platform whose graphs share memory it is the largest forward, so the others fit in its memory."""
    platform = config.selection.platform_instance
    new_graph, reason = decode_graph_factory(platform, runner.backend, config.enforce_eager)
    if new_graph is None:
        logger.info("decode graphs: off (%s)", reason)
        return
    max_tokens = min(platform.capabilities.prefill_graph_max_tokens, config.max_num_batched_tokens,
                     config.model.max_model_len)
    if max_tokens >= PREFILL_BUCKET_STEP:
        runner.prefill_graphs = PrefillGraphRunner(
            runner.model, runner.backend, runner.kv_caches, max_tokens=max_tokens,
            max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=config.cache.block_size,
            device=runner.device, new_graph=new_graph)
        if not runner.prefill_graphs.capture(defer=defer):
            runner.prefill_graphs = None
    largest = min(config.max_num_seqs, platform.capabilities.graph_max_batch or config.max_num_seqs)
    runner.decode_graphs = DecodeGraphRunner(
        runner.model, runner.backend, runner.kv_caches, max_num_seqs=largest,
        max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=config.cache.block_size,
        device=runner.device, new_graph=new_graph)
    if runner.decode_graphs.capture():
        logger.info("decode graphs: %s", reason)
    else:
        runner.decode_graphs = None
