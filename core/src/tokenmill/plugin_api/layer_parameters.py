"""layer_parameter: a quantized layer's parameter with the loading attributes ``create_weights`` sets.

Core's linear loader reads these attributes from each registered parameter (see
``Quantizer.create_weights``): ``output_dim`` (the dimension holding ``out_features``, along which
fused shards are concatenated), ``pack_factor`` (output features one stored element packs along it),
``per_shard`` (dim 0 has one entry per fused shard), ``weight_loader`` (a callable
``(param, tensor, shard_index)`` that places a checkpoint tensor itself) and ``checkpoint_optional``
(the checkpoint may lack the tensor). An attribute left at its default is not set at all, which the
loader reads the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def layer_parameter(tensor: torch.Tensor, *, output_dim: int | None = None, pack_factor: int | None = None,
                    per_shard: bool = False, weight_loader: Callable[..., Any] | None = None,
                    checkpoint_optional: bool = False) -> torch.nn.Parameter:
    """``tensor`` as a parameter without gradients, carrying the given loading attributes."""
    param = torch.nn.Parameter(tensor, requires_grad=False)
    attributes = {"output_dim": output_dim, "pack_factor": pack_factor, "weight_loader": weight_loader}
    for name, value in attributes.items():
        if value is not None:
            setattr(param, name, value)
    if per_shard:
        param.per_shard = True
    if checkpoint_optional:
        param.checkpoint_optional = True
    return param


def register_parameters(layer: torch.nn.Module, params: dict[str, torch.nn.Parameter]) -> None:
    """Register each of ``params`` on ``layer`` under its (checkpoint) name, in order."""
    for name, param in params.items():
        layer.register_parameter(name, param)
