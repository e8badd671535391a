"""``weight_loader`` callables for parameters that core's generic shard loading cannot place."""

from __future__ import annotations

import torch

from tokenmill.plugin_api import LinearSpec
from tokenmill.plugin_api.fused_shards import shard_span
from tokenmill_quant_gptq.bitpack import packed_length


class BitPackedShardLoader:
    """Places a shard of values bit-packed along the output dimension (``dim``) at word
    ``offset * bits / 32``; works for widths that do not divide 32 (3 bits: 32 values per 3 words)."""

    def __init__(self, spec: LinearSpec, bits: int, dim: int) -> None:
        self.spec, self.bits, self.dim = spec, bits, dim

    def __call__(self, param: torch.Tensor, loaded: torch.Tensor, shard_index: int | None) -> None:
        index, offset, size = shard_span(self.spec, shard_index)
        if offset * self.bits % 32:
            raise ValueError(f"{self.spec.prefix}: shard {index} starts inside a packed int32 word")
        target = param.data.narrow(self.dim, offset * self.bits // 32, packed_length(size, self.bits))
        if tuple(loaded.shape) != tuple(target.shape):
            raise ValueError(f"{self.spec.prefix}: packed shard {index} has shape {tuple(loaded.shape)}, "
                             f"expected {tuple(target.shape)}")
        target.copy_(loaded)


class SharedGroupIndexLoader:
    """Loads a group index (``g_idx``) once per layer and checks every other fused shard carries the
    same one (they share the layer input, so act-order quantizers give them the same order)."""

    def __init__(self, spec: LinearSpec, groups: int) -> None:
        self.spec, self.groups = spec, groups
        self.loaded = False

    def __call__(self, param: torch.Tensor, loaded: torch.Tensor, shard_index: int | None) -> None:
        if tuple(loaded.shape) != tuple(param.shape):
            raise ValueError(f"{self.spec.prefix}: g_idx has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}")
        if int(loaded.min()) < 0 or int(loaded.max()) >= self.groups:
            raise ValueError(f"{self.spec.prefix}: g_idx refers to groups outside 0..{self.groups - 1}")
        if self.loaded and not torch.equal(param.data, loaded.to(param.dtype)):
            raise ValueError(f"{self.spec.prefix}: fused shards carry different g_idx; they cannot share one layer")
        param.data.copy_(loaded)
        self.loaded = True
