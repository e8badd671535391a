"""AcceptErrorLog: the event loop's exception handler, with asyncio's "socket.accept() out of system
resource" (no file handle or memory left for a new connection) logged as one line at most every ten
seconds instead of a traceback on every failed ``accept``.

asyncio retries a listening socket a second after such an error, but (Python 3.11) keeps calling
``accept`` up to the backlog's count in the same turn and reports each failure: under a connection
flood that was thousands of tracebacks a second. Every other exception goes to the loop's default
handler as before.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from typing import Any

from tokenmill_server.rate_limited_log import RateLimitedLog

logger = logging.getLogger("tokenmill.server")
ACCEPT_FAILED = "socket.accept() out of system resource"


class AcceptErrorLog:
    """Call as ``handler(loop, context)``; ``install`` sets it on the running loop."""

    def __init__(self, interval: float = 10.0) -> None:
        self.log = RateLimitedLog(logger, interval)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != ACCEPT_FAILED:
            loop.default_exception_handler(context)
            return
        error = context.get("exception")
        number = getattr(error, "errno", None)
        reason = f"{errno.errorcode.get(number, number)}: {os.strerror(number)}" if isinstance(number, int) else \
            str(error)
        self.log.emit("cannot accept new connections (%s); retrying every second (--max-connections bounds "
                      "the connections open at once)", reason)

    def install(self) -> AcceptErrorLog:
        """Make this the running loop's exception handler."""
        asyncio.get_running_loop().set_exception_handler(self)
        return self
