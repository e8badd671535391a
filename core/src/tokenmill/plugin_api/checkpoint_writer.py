"""checkpoint_writer: a format's ``Quantizer.quantize_checkpoint`` made from the function that writes
its checkpoints, keeping that function's signature so ``tokenmill quantize`` offers its options."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any


def checkpoint_writer(write: Callable[..., Mapping[str, Any]]) -> Any:
    """A classmethod for ``Quantizer.quantize_checkpoint`` that calls ``write(model_dir, out_dir,
    **options)``; it wraps ``write`` (``functools.wraps``), so its keyword-only parameters are the
    options and its docstring is the method's."""

    @functools.wraps(write)
    def quantize_checkpoint(cls: type, model_dir: str, out_dir: str, **options: Any) -> Mapping[str, Any]:
        return write(model_dir, out_dir, **options)

    return classmethod(quantize_checkpoint)
