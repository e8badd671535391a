"""A GGUF checkpoint seen as a Hugging Face model: config, tokenizer and HF-named tensors.

Tensors are returned either dequantized (float32) or packed (the raw ggml blocks, uint8). Both
undo llama.cpp's conversion-time edits the way transformers does when it loads GGUF: the q/k row
permutation of llama-architecture attention weights, and Gemma's ``+1`` on norm weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from tokenmill_quant_gguf import tensor_names
from tokenmill_quant_gguf.dequantize import dequantize
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.gguf_file import GGUFFile
from tokenmill_quant_gguf.hf_config import hf_config_from_gguf


def find_gguf_file(model_path: str) -> str:
    """The GGUF file ``model_path`` names: the file itself, or the only ``.gguf`` in a directory."""
    if os.path.isfile(model_path):
        return model_path
    if not os.path.isdir(model_path):
        raise ValueError(f"{model_path}: no such file or directory")
    found = sorted(name for name in os.listdir(model_path) if name.endswith(".gguf"))
    if len(found) != 1:
        listing = ", ".join(found) or "none"
        raise ValueError(f"{model_path}: expected exactly one .gguf file, found {listing}; pass the file's path")
    return os.path.join(model_path, found[0])


class GGUFCheckpoint:
    """One validated GGUF file of a supported architecture."""

    def __init__(self, model_path: str) -> None:
        self.path = find_gguf_file(model_path)
        self.file = GGUFFile(self.path)
        meta = self.file.metadata
        self.architecture = meta.get("general.architecture")
        if self.architecture not in tensor_names.SUPPORTED_ARCHITECTURES:
            supported = ", ".join(tensor_names.SUPPORTED_ARCHITECTURES)
            raise ValueError(f"{self.path}: GGUF architecture {self.architecture!r} is not supported ({supported})")
        if meta.get("split.count", 1) != 1:
            raise ValueError(f"{self.path}: split GGUF files are not supported; merge them with llama-gguf-split")
        self._hf_names = {}
        for name in self.file.tensors:
            hf = tensor_names.hf_name(name, self.architecture)
            if hf is not None:
                self._hf_names[name] = hf
        self._gguf_names = {hf: name for name, hf in self._hf_names.items()}

    # -- the model as transformers sees it -------------------------------------------------------

    def hf_config(self) -> dict[str, Any]:
        """The transformers config dict, derived from the metadata as transformers derives it."""
        return hf_config_from_gguf(self.file)

    def tokenizer(self) -> Any:
        """The Hugging Face fast tokenizer (with the chat template) stored in the GGUF metadata,
        converted on the first load of this file and cached (``load_gguf_tokenizer``)."""
        from tokenmill_quant_gguf.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(self.path)

    # -- tensors ---------------------------------------------------------------------------------

    def hf_names(self) -> Iterator[tuple[str, str]]:
        """(GGUF name, Hugging Face name) of every parameter tensor, in file order."""
        yield from self._hf_names.items()

    def gguf_name(self, hf_name: str) -> str | None:
        """The GGUF tensor holding a Hugging Face parameter, or None when the file has none."""
        return self._gguf_names.get(hf_name)

    def ggml_type(self, gguf_name: str) -> GGMLType:
        return self.file.tensors[gguf_name].ggml_type

    def dequantized(self, gguf_name: str) -> torch.Tensor:
        """The tensor as float32, in Hugging Face layout."""
        info = self.file.tensors[gguf_name]
        values = dequantize(self.file.raw(gguf_name), info.ggml_type)
        if self.architecture.startswith("gemma") and tensor_names.stem(gguf_name).endswith("norm"):
            values = values - 1
        return self._unpermute(gguf_name, values)

    def packed(self, gguf_name: str) -> torch.Tensor:
        """The raw ggml blocks of a 2-D tensor as uint8 ``[rows, row_bytes]`` in Hugging Face row order.
        Rows are independent block sequences, so un-permuting rows commutes with dequantization."""
        raw = self.file.raw(gguf_name)
        if raw.dim() != 2:
            raise ValueError(f"{self.path}: tensor {gguf_name!r} is not a matrix, cannot be packed")
        return self._unpermute(gguf_name, raw)

    def _unpermute(self, gguf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Undo llama.cpp's rotary row interleave of q/k (llama architecture only), as transformers does."""
        kind = tensor_names.stem(gguf_name)
        if self.architecture != "llama" or kind not in ("attn_q", "attn_k"):
            return tensor
        meta = self.file.metadata
        n_head = _per_layer(meta["llama.attention.head_count"], gguf_name)
        if kind == "attn_k":
            n_head = _per_layer(meta.get("llama.attention.head_count_kv", n_head), gguf_name)
        rows = tensor.shape[0]
        if rows % (2 * n_head):
            raise ValueError(f"{self.path}: tensor {gguf_name!r} has {rows} rows, not divisible by 2 x {n_head} heads")
        return tensor.reshape(n_head, rows // n_head // 2, 2, *tensor.shape[1:]).transpose(1, 2).reshape(tensor.shape)


def _per_layer(value: int | list[int], gguf_name: str) -> int:
    """Head counts may be stored per layer (a list); pick the tensor's layer."""
    if isinstance(value, list):
        return int(value[int(gguf_name.split(".")[1])])
    return int(value)
