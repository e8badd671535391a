"""Loading per-tensor or per-channel scales into one per-row scale parameter."""

from __future__ import annotations

import torch

from tokenmill.plugin_api import LinearSpec


class RowScaleLoader:
    """``weight_loader`` for a ``[out_features, 1]`` scale: a shard's scalar (per-tensor scale) fills
    all its rows, a ``[rows]`` / ``[rows, 1]`` tensor (per-channel scales) is copied row for row."""

    def __init__(self, spec: LinearSpec) -> None:
        self.spec = spec

    def __call__(self, param: torch.Tensor, loaded: torch.Tensor, shard_index: int | None) -> None:
        if shard_index is None:
            offset, size = 0, self.spec.out_features
        else:
            offset, size = sum(self.spec.output_sizes[:shard_index]), self.spec.output_sizes[shard_index]
        rows = param.data[offset : offset + size]
        if loaded.numel() == 1:
            rows.fill_(float(loaded.reshape(())))
        elif loaded.numel() == size and loaded.dim() <= 2 and loaded.shape[0] == size:
            rows.copy_(loaded.reshape(size, 1))
        else:
            where = "" if shard_index is None else f" shard {shard_index}"
            raise ValueError(f"{self.spec.prefix}{where}: a scale of shape {tuple(loaded.shape)} is neither "
                             f"per-tensor nor per-channel for {size} output rows")
