"""WeightCopies: what a kernel derives once from a weight (packed panels, a bfloat16 copy), kept while
the weight lives and made again when the weight changes in place."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

Copy = TypeVar("Copy")


def _stamp(weight: torch.Tensor) -> tuple[int, int | None, tuple[int, ...]]:
    """The weight's storage, shape and in-place change counter (None for an inference tensor, which
    keeps none: weights made under ``torch.inference_mode``, e.g. dequantized at load, are not changed
    in place)."""
    return weight.data_ptr(), None if weight.is_inference() else weight._version, tuple(weight.shape)


class WeightCopies(Generic[Copy]):
    """``copies(weight)``: ``make(weight)``, made at the first call for that weight and again after it
    changed; dropped when the weight is freed. ``len`` counts the weights held."""

    def __init__(self, make: Callable[[torch.Tensor], Copy]) -> None:
        self._make = make
        self._copies: dict[int, tuple[tuple[int, int | None, tuple[int, ...]], Copy]] = {}

    def __call__(self, weight: torch.Tensor) -> Copy:
        key, stamp = id(weight), _stamp(weight)
        held = self._copies.get(key)
        if held is not None and held[0] == stamp:
            return held[1]
        if held is None:
            weakref.finalize(weight, self._copies.pop, key, None)
        copy = self._make(weight)
        self._copies[key] = (stamp, copy)
        return copy

    def __len__(self) -> int:
        return len(self._copies)
