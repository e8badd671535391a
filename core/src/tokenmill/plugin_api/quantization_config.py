"""A checkpoint's quantization settings: ``config.json``'s ``quantization_config``, or the side file
some quantizers write next to the weights instead (AutoGPTQ's ``quantize_config.json``, AutoAWQ's
``quant_config.json``), and the ``quant_method`` a format recognises itself by."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any


def read_quantization_config(hf_config: Mapping[str, Any], model_path: str, side_file: str | None = None,
                             quant_method: str | None = None) -> Mapping[str, Any] | None:
    """``hf_config``'s ``quantization_config``, else the JSON object in ``model_path/side_file``
    (with ``quant_method`` filled in, since side files omit it), else None. A side file that cannot
    be read raises ``OSError`` or ``ValueError``."""
    config = hf_config.get("quantization_config")
    if isinstance(config, Mapping):
        return config
    path = os.path.join(model_path, side_file) if side_file else None
    if path is not None and os.path.isfile(path):
        with open(path) as f:
            loaded = json.load(f)
        if isinstance(loaded, Mapping):
            return {"quant_method": quant_method, **loaded}
    return None


def declared_method(config: Mapping[str, Any] | None) -> str:
    """The lower-cased ``quant_method`` of a quantization config ("" when there is none)."""
    return str(config.get("quant_method", "")).lower() if isinstance(config, Mapping) else ""


def full_precision_modules(config: Mapping[str, Any], keys: tuple[str, ...] = ("modules_to_not_convert",),
                           ) -> tuple[str, ...]:
    """The modules a format's own config leaves unquantized: the first non-empty list among ``keys``,
    plus ``lm_head``, which these configs never quantize."""
    listed = next((config.get(key) for key in keys if config.get(key)), ())
    return (*listed, "lm_head")


def declares(hf_config: Mapping[str, Any], model_path: str, quant_method: str, side_file: str | None = None) -> bool:
    """Whether the checkpoint's quantization config (see ``read_quantization_config``) says
    ``quant_method``; an unreadable side file counts as no."""
    try:
        config = read_quantization_config(hf_config, model_path, side_file, quant_method)
    except (OSError, ValueError):
        return False
    return declared_method(config) == quant_method
