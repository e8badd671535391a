"""Rejection: one candidate that was not chosen, with the reasons it gave."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rejection:
    """A candidate (backend, kernel, platform) and why it was passed over."""

    name: str
    reasons: tuple[str, ...]

    def render(self) -> str:
        """'name: reason; reason'."""
        return f"{self.name}: {'; '.join(self.reasons) or 'rejected'}"
