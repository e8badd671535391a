"""resolve_config: EngineArgs -> a frozen EngineConfig, with every automatic choice reported.

Order: discover plugins -> describe the checkpoint -> select platform, dtype, attention backend,
quantization and kernels -> platform and plugin defaults for the fields the user left unset ->
model limits, generation defaults and the KV-cache size.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, replace
from typing import Any

from tokenmill.config import CacheConfig, EngineArgs, EngineConfig, ModelConfig, parse_size
from tokenmill.discovery import (
    ModelDescription,
    SelectionRequest,
    build_plugin_manager,
    collect_config_overrides,
    discover,
    select,
)
from tokenmill.spec_decode.config import SpeculativeConfig

logger = logging.getLogger("tokenmill")

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_KV_CACHE_FRACTION = 0.25
DEFAULT_KV_CACHE_CAP = 8 << 30
_GENERATION_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                      "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def _apply_defaults(args: EngineArgs, source: str, overrides: dict[str, Any], report: list[str],
                    sources: dict[str, str]) -> EngineArgs:
    """Take ``overrides`` for fields still at their defaults; unknown fields are reported, and each
    field taken is recorded in ``sources`` with ``source`` (so the report can say who chose it)."""
    defaults = EngineArgs()
    changes = {}
    for name, value in (overrides or {}).items():
        if name not in EngineArgs.field_names():
            report.append(f"note: {source} suggested unknown setting {name}={value!r} (ignored)")
        elif getattr(args, name) == getattr(defaults, name) and value is not None:
            changes[name] = value
            sources[name] = source
            report.append(f"{name} = {value!r} (default from {source})")
    return replace(args, **changes) if changes else args


def _architecture(hf_config: Any) -> str:
    architectures = list(getattr(hf_config, "architectures", None) or [])
    if architectures:
        return architectures[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(hf_config.model_type)
    if name is None:
        raise ValueError(f"cannot tell the architecture of model type {hf_config.model_type!r}")
    hf_config.architectures = [name]
    return name


def _generation_config(model_path: str, mode: str) -> dict[str, Any]:
    path = os.path.join(model_path, "generation_config.json")
    if mode == "none" or not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _eos_ids(hf_config: Any, generation: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for value in (generation.get("eos_token_id"), getattr(hf_config, "eos_token_id", None)):
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return tuple(ids)


def _kv_bytes_per_token(hf_config: Any, kv_cache_dtype: str, dtype: str) -> int:
    config = getattr(hf_config, "text_config", None) or hf_config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = _DTYPE_BYTES[dtype if kv_cache_dtype == "auto" else kv_cache_dtype]
    return config.num_hidden_layers * 2 * kv_heads * head_dim * element


def _kv_cache_memory(args: EngineArgs, platform: Any, model_path: str, report: list[str]) -> int:
    requested = parse_size(args.kv_cache_memory)
    if requested:
        return requested
    memory = platform.memory_info()
    if args.gpu_memory_utilization:
        weights = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(model_path)
                      for f in files if f.endswith((".safetensors", ".gguf"))) if os.path.isdir(model_path) \
            else os.path.getsize(model_path)
        budget = int(args.gpu_memory_utilization * memory.total) - (memory.total - memory.free) - weights
        report.append(f"kv_cache_memory = {budget / 2**30:.2f} GiB (gpu_memory_utilization {args.gpu_memory_utilization} "
                      f"of {memory.total / 2**30:.1f} GiB, less memory in use and ~{weights / 2**30:.2f} GiB of weights)")
        return budget
    budget = min(int(memory.free * DEFAULT_KV_CACHE_FRACTION), DEFAULT_KV_CACHE_CAP)
    report.append(f"kv_cache_memory = {budget / 2**30:.2f} GiB ({DEFAULT_KV_CACHE_FRACTION:.0%} of free memory, "
                  f"at most {DEFAULT_KV_CACHE_CAP >> 30} GiB)")
    return budget


def _selection_request(args: EngineArgs, sources: dict[str, str]) -> SelectionRequest:
    return SelectionRequest(device=args.device, allow_cpu_fallback=args.allow_cpu_fallback,
                            allow_attention_fallback=args.allow_attention_fallback,
                            attention_backend=args.attention_backend, quantization=args.quantization,
                            dtype=args.dtype, dtype_source=sources.get("dtype"), kv_cache_dtype=args.kv_cache_dtype,
                            block_size=args.block_size)


def resolve_config(args: EngineArgs) -> EngineConfig:
    """Resolve ``args`` once; raises ValueError / SelectionError with a clear message on bad input."""
    if not args.model:
        raise ValueError("no model given: pass a model directory or a .gguf file")
    from tokenmill.loader.model_loader import as_hf_config

    report: list[str] = []
    sources: dict[str, str] = {}  # field -> the platform or plugin whose default set it
    registry = discover()
    description = ModelDescription.load(registry, args.model)
    # the platform's defaults (e.g. the dtype its ISA computes fast) apply before the full selection
    platform = select(registry, _selection_request(args, sources)).platform.instantiate()
    args = _apply_defaults(args, f"platform {platform.name}", platform.config_defaults(asdict(args)), report, sources)
    for name, contribution in collect_config_overrides(build_plugin_manager(registry), asdict(args)).items():
        args = _apply_defaults(args, f"plugin {contribution.plugin}", {name: contribution.value}, report, sources)
    selection = select(registry, _selection_request(args, sources), description)
    platform = selection.platform_instance
    dtype = selection.dtype
    report.insert(0, selection.render())

    hf_config = as_hf_config(description.hf_config)
    architecture = _architecture(hf_config)
    generation = _generation_config(description.model_path, args.generation_config)
    generation_defaults = {ours: generation[theirs] for theirs, ours in _GENERATION_FIELDS.items() if theirs in generation}
    if generation_defaults:
        report.append(f"sampling defaults from generation_config.json: {generation_defaults} "
                      f"(--generation-config none to ignore)")

    config = getattr(hf_config, "text_config", None) or hf_config
    model_limit = getattr(config, "max_position_embeddings", None) or 2048
    max_model_len = args.max_model_len or model_limit
    if args.max_model_len and args.max_model_len > model_limit:
        raise ValueError(f"max_model_len={args.max_model_len} is larger than the model's {model_limit} positions "
                         f"(max_position_embeddings)")

    kv_dtype = args.kv_cache_dtype
    per_token = _kv_bytes_per_token(hf_config, kv_dtype, dtype)
    budget = _kv_cache_memory(args, platform, description.model_path, report)
    num_blocks = budget // (per_token * args.block_size)
    capacity = (num_blocks - 1) * args.block_size  # block 0 is the reserved null block
    if capacity < max_model_len:
        if args.max_model_len:
            raise ValueError(f"the KV cache ({budget / 2**20:.0f} MiB, {capacity} tokens) cannot hold one sequence of "
                             f"max_model_len={max_model_len} tokens: raise --kv-cache-memory or lower --max-model-len")
        if capacity < args.block_size:
            raise ValueError(f"the KV cache ({budget / 2**20:.0f} MiB) holds less than one block: raise --kv-cache-memory")
        report.append(f"max_model_len = {capacity} (the KV cache holds no more; the model allows {max_model_len})")
        max_model_len = capacity
    cache = CacheConfig(block_size=args.block_size, num_blocks=num_blocks, kv_cache_dtype=kv_dtype,
                        bytes_per_block=per_token * args.block_size, enable_prefix_caching=args.enable_prefix_caching)
    report.append(f"KV cache: {num_blocks} blocks of {args.block_size} tokens = {cache.num_tokens} tokens, "
                  f"{cache.total_bytes / 2**30:.2f} GiB ({kv_dtype if kv_dtype != 'auto' else dtype})")

    max_num_batched_tokens = args.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if not args.enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        max_num_batched_tokens = max_model_len
        report.append(f"max_num_batched_tokens = {max_model_len} (without chunked prefill a whole prompt must fit)")
    quantizer = selection.quantizer_instance
    speculative = SpeculativeConfig.parse(args.speculative_config)
    if speculative is not None:
        report.append(speculative.describe())
    model = ModelConfig(
        path=description.model_path if os.path.isdir(args.model) else os.path.abspath(args.model),
        tokenizer_path=args.tokenizer or os.path.abspath(args.model),
        architecture=architecture, hf_config=hf_config, dtype=dtype, max_model_len=max_model_len,
        vocab_size=config.vocab_size, eos_token_ids=_eos_ids(hf_config, generation),
        generation_defaults=generation_defaults,
        served_model_name=args.served_model_name or os.path.basename(os.path.normpath(args.model)),
        quantization=quantizer.name if quantizer is not None else "unquantized", chat_template=args.chat_template,
    )
    return EngineConfig(
        model=model, cache=cache, max_num_seqs=args.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=args.enable_chunked_prefill,
        scheduling_policy=args.scheduling_policy, seed=args.seed, max_logprobs=args.max_logprobs,
        num_threads=args.num_threads, selection=selection, report=tuple(report), enforce_eager=args.enforce_eager,
        gpu_memory_utilization=None if parse_size(args.kv_cache_memory) else args.gpu_memory_utilization,
        speculative=speculative,
    )
