"""CheckpointFormat: the quantization format a checkpoint's own files name, read without asking any
quantizer plugin, and the first-party distribution that runs it.

Selection asks this only when no loaded quantizer claims a checkpoint: a checkpoint that names a
format is then an error saying what to install or allow, never loaded as unquantized (its weights
would be read as floats and the output would be garbage).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FORMAT_DISTRIBUTIONS: dict[str, str] = {
    "gguf": "tokenmill-quant-gguf",
    "gptq": "tokenmill-quant-gptq",
    "awq": "tokenmill-quant-awq",
    "fp8": "tokenmill-quant-fp8",
    "int8": "tokenmill-quant-int8",
}
"""First-party format families and the distribution that provides each."""

COMPRESSED_TENSORS_FAMILIES: dict[str, str] = {
    "pack-quantized": "gptq",
    "int-quantized": "int8",
    "naive-quantized": "int8",
    "float-quantized": "fp8",
}
"""compressed-tensors storage formats and the first-party family that reads each."""

QUANT_METHOD_FAMILIES: dict[str, str] = {"gptq": "gptq", "gptq_v2": "gptq", "awq": "awq", "fp8": "fp8", "int8": "int8"}
"""``quantization_config.quant_method`` values and the first-party family that reads each."""

SIDECAR_FILES: dict[str, str] = {"quantize_config.json": "gptq", "quant_config.json": "awq"}
"""Settings files AutoGPTQ and AutoAWQ write next to the weights instead of a config entry."""

GGUF_MAGIC = b"GGUF"
COMPRESSED_TENSORS = "compressed-tensors"


@dataclass(frozen=True)
class CheckpointFormat:
    """``name`` as the checkpoint spells it ("gptq", "compressed-tensors pack-quantized", "gguf",
    "bitsandbytes"), ``family`` the first-party format that reads it (None when tokenmill ships
    none), and ``evidence``: which file says so."""

    name: str
    family: str | None
    evidence: str

    @property
    def distribution(self) -> str | None:
        """The first-party distribution to install for this format, or None."""
        return FORMAT_DISTRIBUTIONS.get(self.family) if self.family else None

    @classmethod
    def read(cls, hf_config: Mapping[str, Any], model_path: str) -> CheckpointFormat | None:
        """The format the checkpoint names, or None for a plain float checkpoint. Reads the config,
        a directory listing and at most one file header, never the weights."""
        gguf = _gguf_file(model_path)
        if gguf is not None:
            return cls("gguf", "gguf", f"{os.path.basename(gguf)} has the GGUF header")
        for key in ("quantization_config", "compression_config"):
            config = hf_config.get(key)
            # a quantization_config without quant_method names no format (tokenmill's own loading
            # options, e.g. a speculative draft's gguf_mode, are merged there)
            if isinstance(config, Mapping) and (config.get("quant_method") or key == "compression_config"):
                return _from_config(config, key)
        if os.path.isdir(model_path):
            for filename, family in SIDECAR_FILES.items():
                if os.path.isfile(os.path.join(model_path, filename)):
                    return cls(family, family, f"{filename} sits next to the weights")
        return None


def _from_config(config: Mapping[str, Any], key: str) -> CheckpointFormat:
    method = str(config.get("quant_method") or (COMPRESSED_TENSORS if key == "compression_config" else "")).lower()
    if method == COMPRESSED_TENSORS:
        storage = compressed_tensors_storage(config)
        name = f"{COMPRESSED_TENSORS} {storage}" if storage else COMPRESSED_TENSORS
        return CheckpointFormat(name, COMPRESSED_TENSORS_FAMILIES.get(storage or ""), f"config.json's {key}")
    return CheckpointFormat(method, QUANT_METHOD_FAMILIES.get(method), f"config.json's {key}.quant_method")


def compressed_tensors_storage(config: Mapping[str, Any]) -> str | None:
    """A compressed-tensors config's storage format: the top-level ``format``, else the one format
    all its config groups share (None when they disagree or say nothing)."""
    top_level = config.get("format")
    if top_level and top_level != "mixed-precision":
        return str(top_level)
    groups = config.get("config_groups") or {}
    formats = {g.get("format") for g in groups.values() if isinstance(g, Mapping) and g.get("format")}
    return str(formats.pop()) if len(formats) == 1 else None


def _gguf_file(model_path: str) -> str | None:
    """The GGUF file a path names: the file itself, or the only ``.gguf`` file of a directory."""
    if os.path.isdir(model_path):
        found = [n for n in os.listdir(model_path) if n.endswith(".gguf")]
        path = os.path.join(model_path, found[0]) if len(found) == 1 else None
    else:
        path = model_path if model_path.endswith(".gguf") else None
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return path if f.read(len(GGUF_MAGIC)) == GGUF_MAGIC else None
    except OSError:
        return None
