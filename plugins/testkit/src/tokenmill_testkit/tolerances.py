"""How close a plugin's numbers must be to the reference's, per compute dtype."""

from __future__ import annotations

import torch

# (atol, rtol) against a float32 reference fed the same dtype-rounded inputs.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float16": (5e-3, 5e-3),
    "bfloat16": (2e-2, 2e-2),
}
FP8_TOLERANCE = (1e-1, 1e-1)  # an fp8 cache keeps 3 mantissa bits of every key and value


def tolerance(dtype: str, kv_cache_dtype: str = "auto", overrides: dict[str, tuple[float, float]] | None = None,
              ) -> tuple[float, float]:
    """(atol, rtol) for compute ``dtype``, loosened for an fp8 cache; ``overrides`` wins."""
    table = {**TOLERANCES, **(overrides or {})}
    atol, rtol = table.get(dtype, TOLERANCES["float32"])
    if kv_cache_dtype.startswith("fp8"):
        atol, rtol = max(atol, FP8_TOLERANCE[0]), max(rtol, FP8_TOLERANCE[1])
    return atol, rtol


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, what: str) -> None:
    """Compare in float32 on the CPU; the message names ``what`` was compared."""
    torch.testing.assert_close(
        actual.detach().float().cpu(), expected.detach().float().cpu(), atol=atol, rtol=rtol,
        msg=lambda detail: f"{what}: {detail}",
    )
