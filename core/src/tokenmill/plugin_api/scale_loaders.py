"""Weight loaders for scale parameters that core's generic shard placement cannot fill."""

from __future__ import annotations

from typing import Any

from tokenmill.plugin_api.fused_shards import shard_span
from tokenmill.plugin_api.quantization import LinearSpec


class RowScaleLoader:
    """``weight_loader`` for an ``[out_features, 1]`` scale (one per output row): a shard's scalar
    (per-tensor scale) fills all its rows, a ``[rows]`` / ``[rows, 1]`` tensor (per-channel scales)
    is copied row for row; any other shape is a ``ValueError``."""

    def __init__(self, spec: LinearSpec) -> None:
        self.spec = spec

    def __call__(self, param: Any, loaded: Any, shard_index: int | None) -> None:
        """Place checkpoint tensor ``loaded`` into the rows of shard ``shard_index`` of ``param``."""
        _, offset, size = shard_span(self.spec, shard_index)
        rows = param.data[offset : offset + size]
        if loaded.numel() == 1:
            rows.fill_(float(loaded.reshape(())))
        elif loaded.numel() == size and loaded.dim() <= 2 and loaded.shape[0] == size:
            rows.copy_(loaded.reshape(size, 1))
        else:
            where = "" if shard_index is None else f" shard {shard_index}"
            raise ValueError(f"{self.spec.prefix}{where}: a scale of shape {tuple(loaded.shape)} is neither "
                             f"per-tensor nor per-channel for {size} output rows")
