"""Calibration data for data-aware quantization (GPTQ, AWQ's scale search): fixed-length token
windows cut from a text file, or from tokenmill's built-in English text when none is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

DEFAULT_SEQUENCES = 16
DEFAULT_LENGTH = 128  # 16 x 128 tokens fit the built-in text without overlap


def calibration_text(path: str | Path | None = None) -> str:
    """The text of ``path``, or the built-in calibration text."""
    if path is None:
        from tokenmill.plugin_api.quantize_tools.calibration_text import CALIBRATION_TEXT

        return CALIBRATION_TEXT
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"calibration file {file} does not exist")
    return file.read_text(encoding="utf-8")


def calibration_windows(tokenizer: Any, text: str, count: int = DEFAULT_SEQUENCES,
                        length: int = DEFAULT_LENGTH) -> torch.Tensor:
    """``count`` windows of ``length`` tokens, int64 ``[count, length]``, spread evenly over the
    tokenized ``text`` (they overlap when the text is shorter than ``count * length`` tokens)."""
    if count <= 0 or length <= 1:
        raise ValueError(f"calibration needs at least one window of two tokens, got {count} x {length}")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) < length:
        raise ValueError(f"the calibration text has {len(ids)} tokens, fewer than one window of {length}")
    last = len(ids) - length
    starts = [round(i * last / (count - 1)) for i in range(count)] if count > 1 else [0]
    return torch.tensor([ids[s : s + length] for s in starts], dtype=torch.int64)
