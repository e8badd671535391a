"""build_engine_core: turn a resolved EngineConfig into a running EngineCore (model loaded, cache allocated)."""

from __future__ import annotations

import logging
import time

import torch

from tokenmill.config import EngineConfig
from tokenmill.discovery import build_plugin_manager, discover
from tokenmill.engine.engine_core import EngineCore
from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import load_model
from tokenmill.runner.model_runner import ModelRunner
from tokenmill.scheduler.config import SchedulerConfig
from tokenmill.scheduler.scheduler import Scheduler

logger = logging.getLogger("tokenmill")


def build_engine_core(config: EngineConfig) -> EngineCore:
    """Load the model on the selected platform, allocate the KV cache, and wire the scheduler."""
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
    logger.info("loaded %s (%s, %s) in %.1f s; linear kernels: %s", config.model.architecture, config.model.dtype,
                config.model.quantization, time.perf_counter() - started, build.kernel_summary())

    runner = ModelRunner(model, backend, num_blocks=config.cache.num_blocks, block_size=config.cache.block_size,
                         max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
                         max_model_len=config.model.max_model_len, vocab_size=config.model.vocab_size,
                         device=platform.torch_device())
    scheduler = Scheduler(SchedulerConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.model.max_model_len, block_size=config.cache.block_size,
        num_blocks=config.cache.num_blocks, enable_prefix_caching=config.cache.enable_prefix_caching,
        enable_chunked_prefill=config.enable_chunked_prefill, policy=config.scheduling_policy))
    hooks = build_plugin_manager(discover()).hook
    hooks.on_engine_start(engine_info={
        "platform": platform.name, "device": str(platform.torch_device()), "model": config.model.path,
        "dtype": config.model.dtype, "kv_cache_blocks": config.cache.num_blocks, "block_size": config.cache.block_size})
    return EngineCore(scheduler, runner, on_request_finished=hooks.on_request_finished,
                      on_stop=hooks.on_engine_stop)
