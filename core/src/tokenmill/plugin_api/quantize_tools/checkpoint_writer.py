"""Writing a quantized checkpoint directory: the source's config.json with a ``quantization_config``,
its tokenizer and generation files copied, and the tensors in safetensors shards (with an index
when there is more than one), as ``save_pretrained`` lays them out."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from tokenmill.plugin_api.quantize_tools.float_checkpoint import FloatCheckpoint

SHARD_BYTES = 4 << 30
INDEX_FILE = "model.safetensors.index.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


def write_checkpoint(source: FloatCheckpoint, out_dir: str | Path, tensors: Iterable[tuple[str, torch.Tensor]],
                     quantization_config: Mapping[str, Any], shard_bytes: int = SHARD_BYTES) -> Path:
    """Write ``tensors`` and ``source``'s other files to ``out_dir`` (created; it must not be the
    source directory nor hold another checkpoint's weights). Returns the directory."""
    out = new_checkpoint_directory(out_dir, source.path)
    for item in source.path.iterdir():
        if item.is_file() and item.suffix not in _WEIGHT_SUFFIXES and item.name not in ("config.json", INDEX_FILE):
            shutil.copy2(item, out / item.name)
    config = dict(source.config)
    config["quantization_config"] = dict(quantization_config)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    write_safetensors_shards(out, tensors, shard_bytes)
    return out


def new_checkpoint_directory(out_dir: str | Path, source: str | Path) -> Path:
    """``out_dir``, created: ``ValueError`` when it is (or is inside) ``source``'s directory or already
    holds a checkpoint's weights, so an output never overwrites or mixes with another model."""
    out = Path(out_dir)
    source_dir = Path(source) if Path(source).is_dir() else Path(source).parent
    if out.resolve() == source_dir.resolve():
        raise ValueError(f"the output directory {out} is the model directory; choose another")
    if out.exists() and any(p.suffix in _WEIGHT_SUFFIXES for p in out.iterdir()):
        raise ValueError(f"{out} already holds model weights; choose an empty or new directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_safetensors_shards(out: Path, tensors: Iterable[tuple[str, torch.Tensor]], shard_bytes: int = SHARD_BYTES) -> None:
    """Write ``tensors`` into ``out`` as ``save_pretrained`` lays them out: ``model.safetensors``, or
    numbered shards of at most ``shard_bytes`` (a tensor larger than that gets a shard of its own) with
    ``model.safetensors.index.json``. Tensors are consumed one at a time; at most one shard is held."""
    from safetensors.torch import save_file

    written: list[tuple[Path, list[str]]] = []  # shards are flushed as they fill, named once all are known
    shard: dict[str, torch.Tensor] = {}
    size = total = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > shard_bytes:
            written.append(_flush(out, shard, len(written)))
            shard, size = {}, 0
        shard[name] = tensor.contiguous()
        size += nbytes
        total += nbytes
    if not written:
        save_file(shard, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    written.append(_flush(out, shard, len(written)))
    weight_map = {}
    for index, (part, names) in enumerate(written, start=1):
        file = f"model-{index:05d}-of-{len(written):05d}.safetensors"
        part.rename(out / file)
        weight_map.update(dict.fromkeys(names, file))
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def _flush(out: Path, shard: dict[str, torch.Tensor], index: int) -> tuple[Path, list[str]]:
    from safetensors.torch import save_file

    part = out / f"shard-{index:05d}.part"
    save_file(shard, str(part), metadata={"format": "pt"})
    return part, list(shard)
