"""RateLimitedLog: a log line that may be due thousands of times a second (a flood's symptom), written
at most once per interval, with the count of the ones left out since the last."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """``emit`` logs its message at once, then at most once per ``interval`` seconds; a line after a
    quiet spell says how many were left out."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval = interval
        self.level = level
        self.clock = clock
        self.suppressed = 0
        self._last: float | None = None

    def emit(self, message: str, *args: object) -> bool:
        """Log ``message % args`` unless one was logged within the interval; True when it was logged."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            self.suppressed += 1
            return False
        if self.suppressed:
            message += f" ({self.suppressed} more like it in the last {now - self._last:.0f} s not logged)"
            self.suppressed = 0
        self._last = now
        self.logger.log(self.level, message, *args)
        return True
