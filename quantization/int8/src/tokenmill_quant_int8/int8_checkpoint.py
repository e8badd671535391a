"""``tokenmill quantize --format int8``: a float checkpoint rewritten with symmetric per-channel
int8 decoder linear weights in tokenmill's own config shape (``quant_method: int8``), run
weight-only (``activations="none"``, W8A16) or with activations quantized per token at run time
(``activations="dynamic"``, W8A8)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokenmill.plugin_api.quantize_tools import FloatCheckpoint, write_checkpoint
from tokenmill_quant_int8.int8_scheme import ACTIVATIONS
from tokenmill_quant_int8.quantize import quantize_int8


def quantize_checkpoint(model_dir: str, out_dir: str, *, activations: str = "none") -> dict[str, Any]:
    """Write ``model_dir``'s decoder linears as int8 to ``out_dir``; returns the
    ``quantization_config`` written."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"int8 activations {activations!r} must be one of {', '.join(ACTIVATIONS)}")
    source = FloatCheckpoint(model_dir)
    names = set(source.linear_weights())
    config = {"quant_method": "int8", "activations": activations, "modules_to_not_convert": ["lm_head"]}
    write_checkpoint(source, Path(out_dir), _tensors(source, names), config)
    return config


def _tensors(source: FloatCheckpoint, names: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    for name in source.names():
        if name in names:
            yield from quantize_int8(source.tensor(name), "channel").state_dict(name.removesuffix(".weight")).items()
        else:
            yield name, source.tensor(name)
