"""Reading a compressed-tensors ``quantization_config`` (llm-compressor's checkpoints) by hand:
importing the compressed-tensors library costs seconds.

Example (llm-compressor's W4A16 preset)::

    {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
     "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}}}}

Several formats (``float-quantized``, ``int-quantized``, ``pack-quantized``, ...) share this shape;
each quantization plugin claims the formats it reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

QUANT_METHOD = "compressed-tensors"
"""The ``quant_method`` of every compressed-tensors checkpoint."""

LINEAR_TARGET = "Linear"
"""The target pattern that names every linear layer."""


def compressed_tensors_format(hf_config: Mapping[str, Any]) -> str | None:
    """The compressed-tensors format ("pack-quantized", ...) of the checkpoint whose ``config.json``
    is ``hf_config``, or None if it is not a compressed-tensors checkpoint."""
    return config_format(hf_config.get("quantization_config"))


def config_format(config: Mapping[str, Any] | None) -> str | None:
    """The format a compressed-tensors ``quantization_config`` declares, or None for any other
    config. A "mixed-precision" top level defers to the groups' format when they all share one."""
    if not isinstance(config, Mapping) or config.get("quant_method") != QUANT_METHOD:
        return None
    top_level = config.get("format")
    if top_level and top_level != "mixed-precision":
        return top_level
    groups = config.get("config_groups") or {}
    formats = {g.get("format") for g in groups.values() if isinstance(g, Mapping) and g.get("format")}
    return formats.pop() if len(formats) == 1 else top_level


def single_config_group(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The one config group of ``quantization_config`` ``config`` and its ``weights`` settings ({} when
    absent); ``ValueError`` for any other number of groups."""
    groups = [g for g in (config.get("config_groups") or {}).values() if isinstance(g, Mapping)]
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors: {len(groups)} config groups; exactly one is supported")
    return groups[0], groups[0].get("weights") or {}


def module_matches(module: str, patterns: tuple[str, ...]) -> bool:
    """Whether module path ``module`` matches one of ``patterns``: "re:<regex>" matched from the start
    of the path, otherwise the path itself or its last components (``"lm_head"``, ``"mlp.down_proj"``)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif module == pattern or module.endswith("." + pattern):
            return True
    return False
