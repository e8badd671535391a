"""The HTTP port's socket: bound before the model loads, so a port another process holds fails the
start at once (not after the load), and listening only once the server serves, so a client never
reaches a port that cannot answer.

The kernel's queue of connections not yet accepted (``LISTEN_QUEUE``) is set apart from how many
asyncio accepts in one loop turn (the ``backlog`` it is given, bounded by the connection cap's
file headroom): a burst of connections waits in the queue instead of being dropped, without one
turn taking more files than the headroom.
"""

from __future__ import annotations

import socket

LISTEN_QUEUE = 4096  # the kernel caps it at net.core.somaxconn


class PortUnavailableError(OSError):
    """The address cannot be bound (in use, not local, not permitted)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet); PortUnavailableError naming the
    address and the reason otherwise."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        raise PortUnavailableError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past connections' TIME_WAIT only
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise PortUnavailableError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def deepen_queue(sock: socket.socket) -> None:
    """Give a listening socket the full kernel queue (asyncio's ``listen`` used its per-turn backlog)."""
    sock.listen(LISTEN_QUEUE)
