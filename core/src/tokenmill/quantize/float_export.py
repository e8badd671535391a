"""export_float_checkpoint: a self-contained checkpoint file (a GGUF) written out as a float Hugging Face
directory -- config.json, safetensors and tokenizer files -- that ``tokenmill quantize`` and transformers read.

Everything comes through the quantization contract of the format that recognises the file
(``Quantizer.hf_config``, ``weights`` and ``tokenizer``), so core needs no knowledge of the file format.
The tensors are the format's dequantized values: exactly what tokenmill computes with when it loads
the file dequantized, so a checkpoint quantized from the export starts from the same model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokenmill.discovery import PluginRegistry
from tokenmill.discovery.model_description import recognising_quantizers
from tokenmill.plugin_api import Quantizer

FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def _format_for(registry: PluginRegistry, model_path: str) -> tuple[Quantizer, dict[str, Any]]:
    """The most confident recognising format that supplies both the file's config and its tensors."""
    ranked, notes = recognising_quantizers(registry, model_path)
    for _, record in ranked:
        quantizer = record.obj.from_config({}, model_path)
        config = quantizer.hf_config(model_path)
        if config is not None:
            return quantizer, config
    raise ValueError(f"{model_path}: no installed quantization format recognises it as a self-contained checkpoint "
                     f"(a model directory with config.json and safetensors is already a float checkpoint)"
                     + (f"; {'; '.join(notes)}" if notes else ""))


def _converted(tensors: Iterator[tuple[str, Any]] | None, dtype: Any, model_path: str) -> Iterator[tuple[str, Any]]:
    if tensors is None:
        raise ValueError(f"{model_path}: its format supplies no tensors of its own; nothing to export")
    for name, tensor in tensors:
        if not tensor.dtype.is_floating_point:
            raise ValueError(f"{model_path}: tensor {name} comes as {tensor.dtype}, not dequantized to float")
        yield name, tensor.to(dtype)


def export_float_checkpoint(registry: PluginRegistry, model_path: str, out_dir: str, dtype: str = "float32") -> Path:
    """Write ``model_path`` (a file such as a ``.gguf``) to the new directory ``out_dir`` in ``dtype``;
    returns the directory. ``ValueError`` for a file no installed format reads, a dtype that is not a
    float type, or an ``out_dir`` that already holds weights."""
    import torch

    from tokenmill.plugin_api.quantize_tools import new_checkpoint_directory, write_safetensors_shards

    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"--dtype {dtype}: export writes one of {', '.join(FLOAT_DTYPES)}")
    quantizer, config = _format_for(registry, model_path)
    out = new_checkpoint_directory(out_dir, model_path)
    config = {key: value for key, value in config.items() if key != "quantization_config"}
    config["torch_dtype"] = dtype
    write_safetensors_shards(out, _converted(quantizer.weights(model_path), getattr(torch, dtype), model_path))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer = quantizer.tokenizer(model_path)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out
