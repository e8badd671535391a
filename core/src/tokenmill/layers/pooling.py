"""Pooling: per-token hidden states of a flat batch -> one embedding per sequence (mean, CLS or last).

Optionally L2-normalised; a model directory can declare its pooling through its
sentence-transformers files (``modules.json``, ``<Pooling>/config.json``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F

POOLING_METHODS = ("mean", "cls", "last")
_SENTENCE_TRANSFORMERS_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                                "pooling_mode_lasttoken": "last"}


@dataclass(frozen=True)
class PoolingConfig:
    """How to turn a sequence's hidden states into its embedding."""

    method: str = "last"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.method not in POOLING_METHODS:
            raise ValueError(f"pooling method {self.method!r} is not supported (supported: {', '.join(POOLING_METHODS)})")

    @classmethod
    def from_model_dir(cls, path: str, default: PoolingConfig) -> PoolingConfig:
        """The pooling a sentence-transformers model directory declares, else ``default``.

        Raises ValueError for a declared mode tokenmill does not implement (max, mean-sqrt-len).
        """
        modules_file = os.path.join(path, "modules.json") if os.path.isdir(path) else ""
        if not os.path.isfile(modules_file):
            return default
        with open(modules_file) as f:
            modules = json.load(f)
        kinds = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules}
        method = default.method
        if "Pooling" in kinds:
            with open(os.path.join(path, kinds["Pooling"].get("path", ""), "config.json")) as f:
                settings = json.load(f)
            chosen = [mode for key, mode in _SENTENCE_TRANSFORMERS_MODES.items() if settings.get(key)]
            others = [key for key, on in settings.items() if key.startswith("pooling_mode_") and on
                      and key not in _SENTENCE_TRANSFORMERS_MODES]
            if others or len(chosen) != 1:
                raise ValueError(f"{path}: the sentence-transformers pooling {sorted(others) or chosen} is not "
                                 f"supported (supported: one of {', '.join(POOLING_METHODS)})")
            method = chosen[0]
        return cls(method=method, normalize="Normalize" in kinds)


DEFAULT_DECODER_POOLING = PoolingConfig(method="last", normalize=True)
"""What a decoder pools with unless its checkpoint says otherwise: the last token, normalised."""


def pool(hidden: torch.Tensor, seq_lens: Sequence[int], config: PoolingConfig) -> torch.Tensor:
    """``hidden`` [T, H] of sequences laid end to end (lengths ``seq_lens``) -> float32 [B, H]."""
    lens = torch.tensor(list(seq_lens), device=hidden.device)
    ends = lens.cumsum(0)
    starts = ends - lens
    hidden = hidden.float()
    if config.method == "cls":
        pooled = hidden.index_select(0, starts)
    elif config.method == "last":
        pooled = hidden.index_select(0, ends - 1)
    else:
        owner = torch.repeat_interleave(torch.arange(len(lens), device=hidden.device), lens)
        sums = hidden.new_zeros(len(lens), hidden.shape[-1]).index_add_(0, owner, hidden)
        pooled = sums / lens[:, None].to(hidden.dtype)
    return F.normalize(pooled, p=2, dim=-1) if config.normalize else pooled
