"""Model loading: resolve the architecture, build the model on the device, copy the checkpoint's
tensors into its parameters, check nothing is missing, and let the linear kernels repack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from tokenmill.layers.activation import SiluAndMul
from tokenmill.layers.context import ModelBuildContext
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryEmbedding
from tokenmill.models.registry import resolve_model_class
from tokenmill.plugin_api import Quantizer
from tokenmill.plugin_api.linear import Linear
from tokenmill.plugin_api.model import missing_members
from tokenmill.plugin_api.safetensors_checkpoint import SafetensorsCheckpoint


class MissingWeightsError(ValueError):
    """The checkpoint does not provide every parameter the model needs."""


def as_hf_config(hf_config: Any) -> Any:
    """A transformers config from a config object or a config.json-style dict (with ``model_type``)."""
    if not isinstance(hf_config, Mapping):
        return hf_config
    from transformers import AutoConfig

    values = dict(hf_config)
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise ValueError("the model config has no 'model_type'; cannot tell which architecture it describes")
    try:
        return AutoConfig.for_model(model_type, **values)
    except ValueError:  # transformers' message lists every model type it knows (some 12 KB)
        from tokenmill.models.registry import MODEL_REGISTRY, UnsupportedArchitectureError

        named = ", ".join(map(str, values.get("architectures") or [])) or model_type
        raise UnsupportedArchitectureError(
            f"the checkpoint's architecture ({named}, model_type {model_type!r}) is not supported: neither tokenmill "
            f"nor transformers knows it; tokenmill runs {', '.join(MODEL_REGISTRY.supported())}") from None


def build_model(hf_config: Any, build: ModelBuildContext) -> nn.Module:
    """The registered model class for ``hf_config``, constructed with parameters on ``build.device``
    (uninitialised until weights are loaded); its RMSNorm, rotary, SiluAndMul, embedding and linear
    layers get ``build.layer_kernels``. ``TypeError`` when the class lacks a member of the model
    contract (``tokenmill.plugin_api.Model``)."""
    hf_config = as_hf_config(hf_config)
    model_class = resolve_model_class(hf_config)
    with torch.device(build.device):
        model = model_class(hf_config, build)
    missing = missing_members(model)
    if missing:
        raise TypeError(f"{model_class.__module__}.{model_class.__qualname__} does not implement the model contract "
                        f"(tokenmill.plugin_api.Model): missing {', '.join(missing)}")
    if build.layer_kernels is not None:
        for module in model.modules():
            if isinstance(module, (RMSNorm, RotaryEmbedding, SiluAndMul, VocabEmbedding, Linear)):
                module.kernels = build.layer_kernels
    return model.eval()


def load_weights(model: nn.Module, model_path: str, quantizer: Quantizer | None = None) -> set[str]:
    """Load the checkpoint at ``model_path`` into ``model`` (from ``quantizer.weights`` when the
    format supplies its own tensors, else from safetensors files) and finish every linear layer.
    Returns the loaded parameter names; raises ``MissingWeightsError`` naming what is missing."""
    weights = quantizer.weights(model_path) if quantizer is not None else None
    if weights is None:
        weights = SafetensorsCheckpoint(model_path).tensors()
    with torch.no_grad():
        loaded = model.load_weights(weights)
    required = {name for name, param in model.named_parameters() if not getattr(param, "checkpoint_optional", False)}
    missing = sorted(required - loaded)
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise MissingWeightsError(f"the checkpoint at {model_path} does not provide {len(missing)} of the model's "
                                  f"{len(required)} parameters (or only some shards of fused ones): {shown}")
    for module in model.modules():
        if isinstance(module, Linear):
            module.process_weights_after_loading()
    return loaded


def load_model(hf_config: Any, model_path: str, build: ModelBuildContext) -> nn.Module:
    """``build_model`` then ``load_weights``: a model ready to run."""
    model = build_model(hf_config, build)
    load_weights(model, model_path, build.quantizer)
    return model
