"""Gemma3ForCausalLM: Gemma 2's decoder with q/k norms and its own rotary base for sliding layers.

By default five sliding-window layers alternate with each global one.

Only the text model: a multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration) is not served.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, ClassVar

from tokenmill.layers.rotary import RotaryEmbedding, build_rotary
from tokenmill.models.gemma2 import SLIDING, Gemma2ForCausalLM
from tokenmill.models.llama import head_size

LOCAL_ROPE_THETA = 10_000.0


def layer_type_rope(config: Any, layer_type: str) -> dict[str, Any]:
    """The rope parameters of ``layer_type`` layers: transformers 5 keeps one dict per layer type;
    older configs give the global ``rope_theta`` / ``rope_scaling`` and ``rope_local_base_freq``."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, Mapping) and isinstance(params.get(layer_type), Mapping):
        return dict(params[layer_type])
    if layer_type == SLIDING:
        return {"rope_type": "default", "rope_theta": getattr(config, "rope_local_base_freq", LOCAL_ROPE_THETA)}
    if isinstance(params, Mapping) and "rope_theta" in params:
        return dict(params)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return {**scaling, "rope_theta": getattr(config, "rope_theta", 1_000_000.0)}


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 text: q/k GemmaRMSNorm, rope per layer type, no attention soft-cap (Hugging Face's
    Gemma 3 ignores ``attn_logit_softcapping``; final logits are still capped)."""

    qk_norm: ClassVar[bool] = True
    default_sliding_window_pattern: ClassVar[int] = 6

    @classmethod
    def rotary_for_layer_type(cls, config: Any, layer_type: str, device: Any) -> RotaryEmbedding:
        """The table of ``layer_type``'s rope parameters. ``max_position_embeddings`` already counts
        linear scaling, so the table stops there instead of at ``factor`` times it."""
        params = layer_type_rope(config, layer_type)
        positions = config.max_position_embeddings
        if params.get("rope_type") == "linear":
            positions = math.ceil(positions / params["factor"])
        view = SimpleNamespace(rope_parameters=params, max_position_embeddings=positions)
        return build_rotary(view, head_size(config), device=device)

    @classmethod
    def attention_soft_cap(cls, config: Any) -> float | None:
        return None
