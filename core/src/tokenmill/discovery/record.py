"""PluginRecord: what discovery learned about one entry point, whether or not it could be used."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from tokenmill.plugin_api import ENTRY_POINT_GROUPS, ProbeResult

KINDS: tuple[str, ...] = tuple(ENTRY_POINT_GROUPS)
"""Plugin kinds in display order: "platform", "attention_backend", "quantizer", "plugin"."""

CORE_DISTRIBUTION = "tokenmill"


class PluginStatus(str, enum.Enum):  # noqa: UP042 (StrEnum needs Python 3.11; core supports 3.10)
    """Whether a discovered plugin can take part in selection, and if not, why not."""

    AVAILABLE = "available"
    UNAVAILABLE = "unavailable"  # loaded fine but cannot run here (probe score 0, missing kernel library)
    INCOMPATIBLE = "incompatible"  # built for another plugin API version
    FAILED = "failed"  # import, validation or probe raised
    BLOCKED = "blocked"  # excluded by TOKENMILL_PLUGINS; never imported


BROKEN = (PluginStatus.FAILED, PluginStatus.INCOMPATIBLE)
"""Statuses of a plugin that is installed but cannot be used through its own fault: never skipped silently."""


@dataclass
class PluginRecord:
    """One entry point (or in-memory test object) and its fate.

    ``name`` is the entry point's name until the object is loaded, then the object's own ``name``
    (what ``--device`` and ``--attention-backend`` refer to). ``reasons`` explain the status in
    short sentences; ``traceback`` is set when something raised.
    """

    kind: str
    name: str
    entry_point: str  # "module:attr", or "<in-memory>" for test objects
    distribution: str | None = None
    version: str | None = None
    obj: Any = None
    status: PluginStatus = PluginStatus.AVAILABLE
    reasons: tuple[str, ...] = ()
    traceback: str | None = None
    api_version: tuple[int, int] | None = None
    probe: ProbeResult | None = None
    entry_name: str = ""  # the entry point's own name, kept when ``name`` becomes the object's

    def __post_init__(self) -> None:
        self.entry_name = self.entry_name or self.name

    @property
    def available(self) -> bool:
        return self.status is PluginStatus.AVAILABLE

    @property
    def is_core(self) -> bool:
        """Whether core itself ships this entry (core's reference entries are never blocked)."""
        return self.distribution == CORE_DISTRIBUTION

    @property
    def device_type(self) -> str | None:
        """The torch device type of a loaded platform class, else None."""
        return getattr(self.obj, "device_type", None) if self.kind == "platform" else None

    @property
    def reason(self) -> str:
        """The first reason, for one-line displays."""
        return self.reasons[0] if self.reasons else ""

    @property
    def source(self) -> str:
        """'distribution version' or the entry point target when the distribution is unknown."""
        if self.distribution:
            return f"{self.distribution} {self.version or ''}".strip()
        return self.entry_point

    def mark(self, status: PluginStatus, *reasons: str, traceback: str | None = None) -> None:
        """Set the status with its reasons (and the traceback of what raised)."""
        self.status = status
        self.reasons = tuple(reasons)
        if traceback is not None:
            self.traceback = traceback
