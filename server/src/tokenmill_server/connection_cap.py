"""ConnectionCap: at most ``--max-connections`` HTTP connections open at once, so a flood of idle
connections cannot use up the process's file handles (then nothing, ``/health`` included, is accepted).

At the cap, a new connection takes the place of the connection idle the longest (connected with nothing
sent yet, or kept alive between requests), which is closed; when every connection is busy the new one
is closed at once. Each open connection counts until its socket closes.

The default cap comes from the soft ``RLIMIT_NOFILE`` (which ``raise_open_file_limit`` lifts to the
hard limit first), less headroom for the process's other files (engine sockets, gRPC, model files,
logs) and for the connections accepted but not yet counted: asyncio accepts up to ``accept_batch``
connections a loop turn, and a file the cap frees closes a few turns later.
"""

from __future__ import annotations

import logging
import resource
from collections import OrderedDict
from typing import Protocol

from tokenmill_server.rate_limited_log import RateLimitedLog

logger = logging.getLogger("tokenmill.server")

MAX_DEFAULT_CONNECTIONS = 32768  # beyond this the process's memory, not its files, is what a flood exhausts
# An accepted connection holds its file for about this many loop turns before the cap can close one in its
# place (accepted; its transport made; connection_made, which evicts; the evicted socket closed), while each
# turn accepts another batch.
IN_FLIGHT_TURNS = 4


class Evictable(Protocol):
    """A connection the cap can close to make room: ``evict`` closes it (nothing is being sent on it)."""

    def evict(self) -> None:
        """Close this idle connection."""


def raise_open_file_limit() -> int:
    """Lift the soft ``RLIMIT_NOFILE`` to the hard limit (an unprivileged process may); returns the soft
    limit in force, an unlimited one read as 2^20."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = 1 << 20
    if soft == resource.RLIM_INFINITY:
        return unlimited
    target = unlimited if hard == resource.RLIM_INFINITY else hard
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as error:
            logger.debug("could not raise the open-file limit from %d to %d: %s", soft, target, error)
    return soft


def file_headroom(open_file_limit: int) -> int:
    """Files kept for everything but client connections: an eighth of the limit, at least 64."""
    return max(64, open_file_limit // 8)


def accept_batch(open_file_limit: int) -> int:
    """The most connections asyncio accepts in one loop turn (the ``backlog`` it is given)."""
    return max(16, min(512, open_file_limit // 32))


def default_max_connections(open_file_limit: int) -> int:
    """The cap that keeps a flood from using the files the process needs: the limit less the headroom and
    less ``IN_FLIGHT_TURNS`` accept batches, at most ``MAX_DEFAULT_CONNECTIONS``, at least 1."""
    spare = file_headroom(open_file_limit) + IN_FLIGHT_TURNS * accept_batch(open_file_limit)
    return max(1, min(MAX_DEFAULT_CONNECTIONS, open_file_limit - spare))


class ConnectionCap:
    """Counts open connections and keeps the idle ones in the order they went idle."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.evicted = 0
        self.refused = 0
        self._open: set[Evictable] = set()
        self._idle: OrderedDict[Evictable, None] = OrderedDict()
        self._log = RateLimitedLog(logger)

    @property
    def num_open(self) -> int:
        return len(self._open)

    def admit(self, connection: Evictable) -> bool:
        """Count a new (idle) connection; at the cap, evict the longest-idle one to make room. False
        when every open connection is busy: the caller closes the new one."""
        if len(self._open) >= self.limit:
            if not self._idle:
                self.refused += 1
                self._log.emit("the connection cap (--max-connections %d) is reached and every connection is busy: "
                               "closing new connections", self.limit)
                return False
            oldest, _ = self._idle.popitem(last=False)
            self._open.discard(oldest)
            self.evicted += 1
            self._log.emit("the connection cap (--max-connections %d) is reached: closing the connections idle "
                           "the longest", self.limit)
            oldest.evict()
        self._open.add(connection)
        self._idle[connection] = None
        return True

    def busy(self, connection: Evictable) -> None:
        """The connection is receiving a request or sending a response: it is not evicted."""
        self._idle.pop(connection, None)

    def idle(self, connection: Evictable) -> None:
        """The connection waits for its next request: the last to be evicted among the idle ones."""
        if connection in self._open:
            self._idle[connection] = None
            self._idle.move_to_end(connection)

    def closed(self, connection: Evictable) -> None:
        self._open.discard(connection)
        self._idle.pop(connection, None)
