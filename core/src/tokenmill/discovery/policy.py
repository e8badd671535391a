"""PluginPolicy: the allow/deny list from ``TOKENMILL_PLUGINS``, applied before anything is imported.

Syntax: comma-separated tokens. A bare token allows (``cuda,cpu``: only plugins matching one of
these load); a token with a leading ``-`` denies (``-metal,-rocm``: everything except these loads).
Both may be mixed: allowed minus denied. A token matches an entry point when it equals the entry
point's name or its distribution's name (``tokenmill-cuda``). Core's own reference entries are
always allowed. Tokens that match nothing produce a warning instead of being silently ignored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

ENV_VAR = "TOKENMILL_PLUGINS"


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@dataclass(frozen=True)
class PluginPolicy:
    """Which plugins may load. An empty ``allow`` means "everything not denied"."""

    allow: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, spec: str | None) -> PluginPolicy:
        """Parse a ``TOKENMILL_PLUGINS`` value; None or blank means no restriction."""
        allow, deny = set(), set()
        for token in (spec or "").split(","):
            token = token.strip()
            if not token:
                continue
            if token.startswith("-"):
                deny.add(_normalise(token[1:]))
            else:
                allow.add(_normalise(token.lstrip("+")))
        return cls(frozenset(allow), frozenset(deny))

    @classmethod
    def from_env(cls) -> PluginPolicy:
        """The policy ``TOKENMILL_PLUGINS`` asks for in this process."""
        return cls.parse(os.environ.get(ENV_VAR))

    @property
    def restricts(self) -> bool:
        return bool(self.allow or self.deny)

    def blocked_reason(self, name: str, distribution: str | None, is_core: bool) -> str | None:
        """Why the entry point ``name`` from ``distribution`` may not load, or None if it may."""
        if is_core:
            return None
        keys = {_normalise(name)} | ({_normalise(distribution)} if distribution else set())
        if keys & self.deny:
            return f"denied by {ENV_VAR}"
        if self.allow and not keys & self.allow:
            return f"not in the {ENV_VAR} allow-list ({', '.join(sorted(self.allow))})"
        return None

    def warnings_for(self, entries: Iterable[tuple[str, str | None, bool]]) -> list[str]:
        """Warnings about the policy itself: tokens that name no installed plugin and denials of
        core's own entries (which always load). ``entries`` holds (entry point name, distribution
        name, is core) for everything discovered."""
        known, core = set(), set()
        for name, distribution, is_core in entries:
            keys = {_normalise(name)} | ({_normalise(distribution)} if distribution else set())
            known |= keys
            if is_core:
                core |= keys
        warnings = []
        for token in sorted(self.allow | self.deny):
            if token not in known:
                choices = ", ".join(sorted(known)) or "none"
                warnings.append(f"{ENV_VAR} names '{token}', which matches no installed plugin (installed: {choices})")
        for token in sorted(self.deny & core):
            warnings.append(f"{ENV_VAR} denies '{token}', but core's own reference entries cannot be blocked")
        return warnings
