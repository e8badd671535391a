"""Loading a speculative-decoding draft model next to the target, on the target's platform."""

from __future__ import annotations

import logging
import time
from typing import Any

from torch import nn

from tokenmill.discovery import ModelDescription, discover
from tokenmill.discovery.quantizer_choice import select_quantizer
from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import as_hf_config, load_model
from tokenmill.spec_decode.config import SpeculativeConfig

logger = logging.getLogger("tokenmill")


def load_draft_model(spec: SpeculativeConfig, platform: Any, *, target: nn.Module, target_path: str, dtype: str,
                     block_size: int, kv_cache_dtype: str, attention_backend: type) -> nn.Module:
    """The draft of ``spec`` (``spec.model``, else the target's checkpoint, with ``spec.quantization_config``
    merged into its config), built like the target on ``platform``. ValueError when its attention layout
    differs from the target's: the draft decodes on the target's KV cache."""
    registry = discover()
    description = ModelDescription.load(registry, spec.model or target_path)
    hf_config = dict(description.hf_config)
    if spec.quantization_config:
        hf_config["quantization_config"] = {**(hf_config.get("quantization_config") or {}), **spec.quantization_config}
    choice = select_quantizer(registry, hf_config, description.model_path, spec.quantization)
    quantizer = choice.quantizer_cls.from_config(hf_config, description.model_path)
    build = ModelBuildContext.for_platform(platform, dtype=spec.dtype or dtype, quantizer=quantizer,
                                           block_size=block_size, kv_cache_dtype=kv_cache_dtype,
                                           attention_backend=attention_backend)
    started = time.perf_counter()
    draft = load_model(as_hf_config(hf_config), description.model_path, build)
    if draft.attention_specs() != target.attention_specs():
        raise ValueError(f"the draft model {description.model_path} has another attention layout (layers, KV heads, "
                         f"head size or KV dtype) than the target: a draft decodes on the target's KV cache, so it "
                         f"must be the same architecture (e.g. the target's checkpoint in another precision)")
    logger.info("loaded the speculative-decoding draft (%s, %s) in %.1f s; linear kernels: %s",
                choice.name, build.dtype_name, time.perf_counter() - started, build.kernel_summary())
    return draft
