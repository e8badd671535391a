"""The GGUF format: llama.cpp checkpoints, read directly (config, tokenizer and weights from one file).

Two layouts for linear layers:

* ``dequantize``: the ggml blocks are expanded to the compute dtype while loading; the layer holds a
  plain ``weight`` and runs ``F.linear`` (``GGUFDequantizedKernel``). Fast, but float-sized.
* ``packed``: the layer keeps the raw blocks (``qweight``, uint8 ``[out_features, row_bytes]``) and
  dequantizes them inside each matmul (``GGUFPackedTorchKernel``; on CPUs ``GGUFPackedCpuKernel``
  reads Q4_0/Q4_1/Q8_0 blocks in place for decode steps, 4.5 bits a weight instead of 32). A fused layer (q/k/v, gate/up)
  stacks its shards' rows; shards of different ggml types are zero-padded to the widest row and
  ``layer.gguf_segments`` records each row range's type. An ``lm_head`` tied to a quantized
  embedding (no ``output.weight`` in the file) gets its own packed copy of the embedding's blocks,
  so a decode step reads e.g. Q8_0 vocabulary rows instead of their float32 expansion.

The mode comes from ``TOKENMILL_GGUF_MODE`` or ``quantization_config["gguf_mode"]`` ("auto" when
neither is set). In ``auto`` each layer follows the kernel core selected for it (its
``gguf_layout``), so a platform asks for packed weights by listing ``gguf-packed-torch`` (or its
own packed GGUF kernel) first in ``quant_kernel_preference``; the default order dequantizes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from tokenmill.plugin_api import LinearSpec, Quantizer, QuantKernel
from tokenmill.plugin_api.fused_shards import FUSED_SHARDS
from tokenmill_quant_gguf.checkpoint import GGUFCheckpoint, find_gguf_file
from tokenmill_quant_gguf.cpu_kernel import GGUFPackedCpuKernel
from tokenmill_quant_gguf.dequantized_kernel import GGUFDequantizedKernel
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.gguf_file import GGUF_MAGIC
from tokenmill_quant_gguf.packed_kernel import GGUFPackedTorchKernel
from tokenmill_quant_gguf.triton_kernel import GGUFPackedTritonKernel

MODE_ENV = "TOKENMILL_GGUF_MODE"
MODES = ("auto", "dequantize", "packed")

_HEAD, _EMBEDDING = "lm_head.weight", "token_embd.weight"


class GGUFQuantizer(Quantizer):
    """GGUF checkpoints (F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and the Q2_K..Q6_K K-quants)."""

    name = "gguf"
    api_version = (2, 0)

    def __init__(self, model_path: str | None = None, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"GGUF mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self._checkpoint = GGUFCheckpoint(model_path) if model_path else None
        self._packed: set[str] = set()  # HF names of the weights created in the packed layout

    @classmethod
    def detect(cls, hf_config: Mapping[str, Any], model_path: str) -> float:
        """1.0 for a ``.gguf`` file (or a directory holding exactly one) with the GGUF magic; 0.5 for a
        directory of several ``.gguf`` files and no safetensors (``from_config`` then explains)."""
        if os.path.isfile(model_path):
            return 1.0 if model_path.endswith(".gguf") and _has_magic(model_path) else 0.0
        if not os.path.isdir(model_path):
            return 0.0
        names = os.listdir(model_path)
        found = [n for n in names if n.endswith(".gguf")]
        if len(found) == 1:
            return 1.0 if _has_magic(os.path.join(model_path, found[0])) else 0.0
        if found and not any(n.endswith(".safetensors") for n in names):
            return 0.5
        return 0.0

    @classmethod
    def from_config(cls, hf_config: Mapping[str, Any], model_path: str) -> GGUFQuantizer:
        """Open and validate the file; the mode comes from ``TOKENMILL_GGUF_MODE``, then
        ``quantization_config["gguf_mode"]``, else ``auto``."""
        options = hf_config.get("quantization_config") or {}
        mode = os.environ.get(MODE_ENV) or options.get("gguf_mode") or "auto"
        return cls(model_path, mode)

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """Dequantized ``F.linear`` first, then packed Triton (GPUs), then the packed torch reference;
        the packed C kernel last, used only where the platform prefers it (CPUs). A platform's own
        linear kernel may run the dequantized layout in place of ``F.linear`` (``Platform.linear_kernels``)."""
        return (GGUFDequantizedKernel, GGUFPackedTritonKernel, GGUFPackedTorchKernel, GGUFPackedCpuKernel)

    def is_quantized(self, spec: LinearSpec) -> bool:
        """True when the file stores the layer (False e.g. for an ``lm_head`` tied to the embedding)."""
        checkpoint = self._require_checkpoint()
        return all(_gguf_name(checkpoint, name) is not None for name in _shard_weight_names(spec))

    def quantizes_tied_lm_head(self, spec: LinearSpec) -> bool:
        """In the packed layout, a head tied to a quantized embedding reads the embedding's blocks."""
        checkpoint = self._require_checkpoint()
        if self.mode != "packed" or _shard_weight_names(spec) != [_HEAD] or checkpoint.gguf_name(_HEAD) is not None:
            return False
        info = checkpoint.file.tensors.get(_EMBEDDING)
        return info is not None and not info.ggml_type.is_float

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register ``weight`` (dequantize layout) or ``qweight`` + ``gguf_segments`` (packed layout),
        both with ``output_dim = 0``; shard shapes are checked against the file."""
        checkpoint = self._require_checkpoint()
        shard_names = _shard_weight_names(spec)
        tensors = [self._shard_tensor(checkpoint, name, spec, size) for name, size in zip(shard_names, spec.output_sizes, strict=True)]
        if self._layout(layer) == "packed":
            types = [t.ggml_type for t in tensors]
            width = max(t.row_bytes(spec.in_features) for t in types)
            qweight = torch.nn.Parameter(torch.zeros(spec.out_features, width, dtype=torch.uint8), requires_grad=False)
            qweight.output_dim = 0
            qweight.weight_loader = _PackedShardLoader(spec, types)
            layer.register_parameter("qweight", qweight)
            layer.gguf_segments = _segments(spec.output_sizes, types)
            self._packed.update(shard_names)
        else:
            dtype = getattr(torch, spec.dtype)
            weight = torch.nn.Parameter(torch.empty(spec.out_features, spec.in_features, dtype=dtype), requires_grad=False)
            weight.output_dim = 0
            layer.register_parameter("weight", weight)

    def shard_types(self, spec: LinearSpec) -> tuple[GGMLType, ...]:
        """The ggml type of each checkpoint shard of the layer (what a packed kernel must read)."""
        checkpoint = self._require_checkpoint()
        names = _shard_weight_names(spec)
        return tuple(self._shard_tensor(checkpoint, name, spec, size).ggml_type
                     for name, size in zip(names, spec.output_sizes, strict=True))

    def weights(self, model_path: str) -> Iterator[tuple[str, Any]]:
        """Every parameter tensor under its Hugging Face name: packed layers' weights as raw blocks
        (``<module>.qweight``), everything else dequantized to float32."""
        checkpoint = self._checkpoint_for(model_path)
        for gguf_name, hf_name in checkpoint.hf_names():
            if hf_name in self._packed:
                yield hf_name.removesuffix("weight") + "qweight", checkpoint.packed(gguf_name)
            else:
                yield hf_name, checkpoint.dequantized(gguf_name)
        if _HEAD in self._packed and checkpoint.gguf_name(_HEAD) is None:
            yield "lm_head.qweight", checkpoint.packed(_EMBEDDING)

    def hf_config(self, model_path: str) -> dict[str, Any]:
        """The transformers config dict derived from the GGUF metadata (as transformers does)."""
        return self._checkpoint_for(model_path).hf_config()

    def tokenizer(self, model_path: str) -> Any:
        """The fast tokenizer and chat template stored in the GGUF metadata."""
        return self._checkpoint_for(model_path).tokenizer()

    def describe(self) -> str:
        """The mode, the file and its tensor types."""
        if self._checkpoint is None:
            return f"gguf ({self.mode})"
        types = Counter(info.ggml_type.name for info in self._checkpoint.file.tensors.values())
        summary = ", ".join(f"{n} {t}" for t, n in types.most_common())
        return f"gguf ({self.mode}; {os.path.basename(self._checkpoint.path)}: {summary})"

    # -- helpers ---------------------------------------------------------------------------------

    def _checkpoint_for(self, model_path: str) -> GGUFCheckpoint:
        if self._checkpoint is None or not _same_source(self._checkpoint.path, model_path):
            self._checkpoint = GGUFCheckpoint(model_path)
        return self._checkpoint

    def _require_checkpoint(self) -> GGUFCheckpoint:
        if self._checkpoint is None:
            raise ValueError("GGUFQuantizer has no checkpoint: create it with from_config(hf_config, model_path)")
        return self._checkpoint

    def _layout(self, layer: Any) -> str:
        if self.mode != "auto":
            return self.mode
        kernel = getattr(layer, "kernel", None)
        return getattr(kernel, "gguf_layout", "dequantize")

    @staticmethod
    def _shard_tensor(checkpoint: GGUFCheckpoint, hf_name: str, spec: LinearSpec, rows: int) -> Any:
        gguf_name = _gguf_name(checkpoint, hf_name)
        if gguf_name is None:
            raise ValueError(f"{checkpoint.path}: no GGUF tensor for {hf_name!r} (layer {spec.prefix})")
        info = checkpoint.file.tensors[gguf_name]
        if info.shape != (rows, spec.in_features):
            raise ValueError(
                f"{checkpoint.path}: tensor {gguf_name!r} has shape {info.shape}, "
                f"but layer {spec.prefix} expects {(rows, spec.in_features)} for {hf_name!r}"
            )
        return info


def _gguf_name(checkpoint: GGUFCheckpoint, hf_name: str) -> str | None:
    """The GGUF tensor of a layer's weight; a tied ``lm_head`` (no ``output.weight``) reads the embedding."""
    gguf_name = checkpoint.gguf_name(hf_name)
    if gguf_name is None and hf_name == _HEAD and _EMBEDDING in checkpoint.file.tensors:
        return _EMBEDDING
    return gguf_name


def _shard_weight_names(spec: LinearSpec) -> list[str]:
    """The checkpoint weight names a layer loads, one per output shard."""
    parent, _, leaf = spec.prefix.rpartition(".")
    shards = FUSED_SHARDS.get(leaf)
    if shards is not None and len(shards) == len(spec.output_sizes):
        return [f"{parent}.{shard}.weight" for shard in shards]
    if len(spec.output_sizes) != 1:
        raise ValueError(f"layer {spec.prefix} fuses {len(spec.output_sizes)} shards that GGUF loading cannot name")
    return [f"{spec.prefix}.weight"]


class _PackedShardLoader:
    """Copies one shard's raw blocks into its rows of a fused ``qweight``; a shard whose ggml type has
    narrower rows than the widest shard's leaves the rest of its rows zero."""

    def __init__(self, spec: LinearSpec, types: list[Any]) -> None:
        self.spec, self.types = spec, types

    def __call__(self, param: torch.Tensor, loaded: torch.Tensor, shard_index: int | None) -> None:
        index = 0 if shard_index is None else shard_index
        sizes = self.spec.output_sizes
        if shard_index is None and len(sizes) != 1:
            raise ValueError(f"{self.spec.prefix}: GGUF stores fused layers per shard, got one whole tensor")
        if not 0 <= index < len(sizes):
            raise ValueError(f"{self.spec.prefix}: no shard {index} in a layer of {len(sizes)} shards")
        offset, rows = sum(sizes[:index]), sizes[index]
        width = self.types[index].row_bytes(self.spec.in_features)
        if loaded.dtype != torch.uint8 or tuple(loaded.shape) != (rows, width):
            raise ValueError(
                f"{self.spec.prefix}: shard {index} expects {self.types[index].name} blocks of shape {(rows, width)} "
                f"(uint8), got {tuple(loaded.shape)} ({loaded.dtype})"
            )
        param.data[offset : offset + rows, :width].copy_(loaded)


def _segments(sizes: tuple[int, ...], types: list[Any]) -> tuple[tuple[int, int, Any], ...]:
    """Row ranges of one ggml type, merging neighbouring shards of the same type."""
    segments: list[tuple[int, int, Any]] = []
    start = 0
    for size, ggml_type in zip(sizes, types, strict=True):
        if segments and segments[-1][2] == ggml_type:
            segments[-1] = (segments[-1][0], start + size, ggml_type)
        else:
            segments.append((start, start + size, ggml_type))
        start += size
    return tuple(segments)


def _has_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _same_source(gguf_path: str, model_path: str) -> bool:
    return os.path.realpath(gguf_path) == os.path.realpath(find_gguf_file(model_path))
