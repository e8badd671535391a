"""FloatCheckpoint: the float Hugging Face checkpoint ``tokenmill quantize`` reads, with the rule for
which of its tensors are decoder linear weights (the ones a format quantizes)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokenmill.plugin_api.safetensors_checkpoint import SafetensorsCheckpoint

# A decoder layer's tensor: "<anything>.layers.<index>.<module path>.weight".
_DECODER_WEIGHT = re.compile(r"(^|\.)layers\.\d+\.(.+)\.weight$")
# Modules inside decoder layers that stay in float: norms and MoE routers (tiny, precision-critical).
_KEPT_LEAVES = re.compile(r"(norm|^gate$|^router$)")


class FloatCheckpoint:
    """A model directory with ``config.json`` and float safetensors weights, read tensor by tensor
    (memory-mapped), so a model is never held twice in memory."""

    def __init__(self, model_dir: str | Path) -> None:
        self.path = Path(model_dir)
        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise ValueError(f"{self.path} is not a Hugging Face model directory (no config.json)")
        self.config: dict[str, Any] = json.loads(config_path.read_text())
        if self.config.get("quantization_config"):
            method = self.config["quantization_config"].get("quant_method", "unknown")
            raise ValueError(f"{self.path} is already quantized ({method}); tokenmill quantize needs float weights")
        self._files = SafetensorsCheckpoint(self.path).files
        self._where: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        from safetensors import safe_open

        for file in self._files:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    self._where[name] = file
                    self._shapes[name] = tuple(handle.get_slice(name).get_shape())

    def names(self) -> list[str]:
        """Every tensor name, in file order."""
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of tensor ``name``, read from the file header (no data loaded)."""
        return self._shapes[name]

    def tensor(self, name: str) -> torch.Tensor:
        """One tensor as stored (dtype unchanged)."""
        from safetensors import safe_open

        with safe_open(str(self._where[name]), framework="pt", device="cpu") as handle:
            return handle.get_tensor(name)

    def linear_weights(self) -> list[str]:
        """Names of the decoder layers' 2-D linear weights (attention and MLP projections, MoE
        experts); embeddings, the LM head, norms and routers are left out."""
        found = []
        for name, shape in self._shapes.items():
            match = _DECODER_WEIGHT.search(name)
            if match is None or len(shape) != 2 or "embed" in name:
                continue
            if _KEPT_LEAVES.search(match.group(2).rpartition(".")[2]):
                continue
            found.append(name)
        if not found:
            raise ValueError(f"{self.path}: found no decoder linear weights (model.layers.N.*.weight) to quantize")
        return found

    def other_tensors(self, quantized: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor not in ``quantized``, as stored: the float part of the output checkpoint."""
        for name in self._where:
            if name not in quantized:
                yield name, self.tensor(name)

    def tokenizer(self) -> Any:
        """The directory's Hugging Face tokenizer (for calibration text)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.path))
