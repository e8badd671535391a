"""Checkpoint-name mapping: Hugging Face tensor names onto a model's (possibly fused) parameters.

The model mirrors the checkpoint's module paths except where it fuses layers: the checkpoint's
``q_proj`` / ``k_proj`` / ``v_proj`` become shards 0 / 1 / 2 of ``qkv_proj`` and ``gate_proj`` /
``up_proj`` shards 0 / 1 of ``gate_up_proj``. The parameter suffix is kept (``weight``, ``bias``,
``qweight``, ``scales`` ...), so quantized checkpoints map the same way.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from tokenmill.plugin_api.linear import Linear, load_shard

logger = logging.getLogger(__name__)

STACKED_PARAMS: tuple[tuple[str, str, int], ...] = (
    ("qkv_proj", "q_proj", 0),
    ("qkv_proj", "k_proj", 1),
    ("qkv_proj", "v_proj", 2),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)
"""(fused module, checkpoint module, shard index)."""

ALWAYS_IGNORED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


class CheckpointMismatchError(ValueError):
    """A checkpoint tensor does not fit the parameter it maps to."""


def map_name(name: str, stacked: Sequence[tuple[str, str, int]] = STACKED_PARAMS) -> tuple[str, int | None]:
    """The model parameter a checkpoint tensor name maps to, and its shard index (None: whole)."""
    for fused, original, shard in stacked:
        part = f".{original}."
        if part in name:
            return name.replace(part, f".{fused}.", 1), shard
    return name, None


def load_checkpoint_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], *,
                            stacked: Sequence[tuple[str, str, int]] = STACKED_PARAMS,
                            ignore: Iterable[str] = ()) -> set[str]:
    """Copy every (name, tensor) into the parameter it maps to and return the names of the
    parameters that are now complete (every shard of a fused one). Names containing one of
    ``ignore`` (or a rotary buffer) are skipped; names that match no parameter are logged."""
    ignore = (*ALWAYS_IGNORED, *ignore)
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    shards: dict[str, set[int | None]] = defaultdict(set)
    unexpected = []
    for name, tensor in weights:
        if any(pattern in name for pattern in ignore):
            continue
        target, shard = map_name(name, stacked)
        param = params.get(target)
        if param is None:
            unexpected.append(name)
            continue
        module_path, _, param_name = target.rpartition(".")
        module = modules[module_path]
        try:
            if isinstance(module, Linear):
                module.load_weight(param_name, tensor, shard)
            elif shard is None:
                load_shard(param, tensor)
            else:
                raise ValueError(f"{module_path} is not a fused linear layer")
        except (ValueError, KeyError) as error:
            message = f"checkpoint tensor {name!r} cannot be loaded into {target}: {error}"
            raise CheckpointMismatchError(message) from error
        shards[target].add(shard)
    if unexpected:
        shown = ", ".join(unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        logger.warning("ignored %d checkpoint tensors that match no parameter: %s", len(unexpected), shown)
    return {
        target
        for target, seen in shards.items()
        if None in seen or len(seen) == getattr(modules[target.rpartition(".")[0]], "num_shards", 1)
    }
