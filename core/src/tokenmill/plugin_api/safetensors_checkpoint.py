"""SafetensorsCheckpoint: the weight files of a checkpoint directory, read lazily one tensor at a
time (memory-mapped by safetensors), so a checkpoint is never held in memory next to the model.

tokenmill never unpickles weights: ``.bin`` / ``.pt`` / ``.pth`` files can execute code when
loaded, so a directory that only has those is refused with a message saying how to convert it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


class CheckpointNotFoundError(FileNotFoundError):
    """The path holds no safetensors weights tokenmill can read."""


def _safetensors_files(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointNotFoundError(f"{path} is not a .safetensors file")
        return [path]
    if not path.is_dir():
        raise CheckpointNotFoundError(f"checkpoint path {path} does not exist")
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointNotFoundError(f"{index} has no 'weight_map'")
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointNotFoundError(f"{index} lists shards that are not in {path}: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    preferred = [f for f in files if f.name.startswith("model")]
    if preferred:
        return preferred
    if files:
        return files
    pickles = sorted(f.name for f in path.iterdir() if f.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointNotFoundError(
            f"{path} has only pickle weights ({', '.join(pickles[:3])}); tokenmill never loads pickles because "
            "unpickling can run arbitrary code. Convert them to safetensors first (e.g. load with transformers "
            "and save_pretrained(..., safe_serialization=True))."
        )
    raise CheckpointNotFoundError(f"no weights found in {path}: expected model.safetensors or {INDEX_FILE} "
                                  "with its shards")


class SafetensorsCheckpoint:
    """The safetensors files of one checkpoint (a directory, sharded or not, or a single file)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.files = _safetensors_files(self.path)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, CPU tensor) pairs, one at a time, file by file."""
        for file in self.files:
            with _opened(file) as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)

    def names(self) -> list[str]:
        """Every tensor name, read from the file headers only."""
        names = []
        for file in self.files:
            with _opened(file) as handle:
                names.extend(handle.keys())
        return names


def _opened(file: Path) -> Any:
    """``safe_open`` on ``file``; a file it cannot read (a header that lies about its tensors, a file cut
    short) is a ValueError naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except SafetensorError as error:
        raise ValueError(f"{file} is not a readable safetensors file: {error}") from None
