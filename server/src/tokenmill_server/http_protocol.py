"""GuardedH11Protocol: uvicorn's h11 protocol with the two timeouts it lacks (slowloris guards).

- Read timeout: a client has ``read_timeout`` seconds from connecting (or from the first byte of a
  later request on a kept-alive connection) to send the whole request, headers and body. If it has
  not, it gets a 408 when no response has started, and the connection is closed; the handler, if
  one runs, sees a disconnect. h11's size limits bound a trickled request's memory, not its time.
- Write timeout: a response that cannot write because the client reads nothing (the transport stays
  paused above its high-water mark) for ``write_timeout`` seconds has its connection closed, which
  the handler sees as a disconnect (a stream's request is aborted).

A plain ``GET /health`` (no body, no Origin) is answered right where its bytes are read, without a
task or the ASGI stack, so a burst of API requests on the event loop cannot hold it up behind their
handlers. Idle kept-alive connections keep uvicorn's own keep-alive timeout. ``send_buffer`` (bytes, 0: the
kernel's autotuning, up to ``net.ipv4.tcp_wmem``'s maximum) caps each connection's kernel send buffer,
so that a stalled reader backs up into the server's own bounded stream buffers sooner. With a
``ConnectionCap``, each connection is counted, busy from its first byte to its response's end and idle
otherwise; at the cap the longest-idle connection is closed to make room (``evict``).
"""

from __future__ import annotations

import asyncio
import functools
import http
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tokenmill_server.connection_cap import ConnectionCap

logger = logging.getLogger("tokenmill.server")
_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)
_HEALTH_LINES = (b"GET /health HTTP/1.1\r\n", b"GET /health HTTP/1.0\r\n")
_HEALTH_MAX_BYTES, _HEALTH_MAX_LINES = 4096, 32
HealthCheck = Callable[[], tuple[int, bytes]]


def _timeout_response() -> bytes:
    body = json.dumps({"error": {"message": "The request was not received in time.", "type": "invalid_request_error",
                                 "param": None, "code": "request_timeout"}}).encode()
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % len(body))
    return head + body


class GuardedH11Protocol(H11Protocol):
    """H11Protocol plus a per-request read deadline and a write-stall deadline."""

    def __init__(self, *args: Any, read_timeout: float, write_timeout: float, send_buffer: int = 0,
                 on_timeout: Callable[[str], None] | None = None, health: HealthCheck | None = None,
                 connection_cap: ConnectionCap | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.health = health
        self.connection_cap = connection_cap
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.send_buffer = send_buffer
        self.on_timeout = on_timeout
        self._read_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None

    @classmethod
    def factory(cls, read_timeout: float, write_timeout: float, send_buffer: int = 0,
                on_timeout: Callable[[str], None] | None = None, health: HealthCheck | None = None,
                connection_cap: ConnectionCap | None = None) -> Callable[..., GuardedH11Protocol]:
        """What ``uvicorn.Config(http=...)`` takes: builds the protocol with these settings; ``health``
        returns the (status, JSON body) of /health; ``connection_cap`` bounds the open connections."""
        return functools.partial(cls, read_timeout=read_timeout, write_timeout=write_timeout, send_buffer=send_buffer,
                                 on_timeout=on_timeout, health=health, connection_cap=connection_cap)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.connection_cap is not None and not self.connection_cap.admit(self):
            transport.abort()  # every open connection is busy: this one waits for nothing
            return
        sock = transport.get_extra_info("socket")
        if self.send_buffer > 0 and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        self._arm_read()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.connection_cap is not None:
            self.connection_cap.closed(self)
        self._disarm_read()
        self._disarm_write()
        super().connection_lost(exc)

    def evict(self) -> None:
        """Close this idle connection (the connection cap needs its place)."""
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.connection_cap is not None and self.timeout_keep_alive_task is not None:
            self.connection_cap.idle(self)  # kept alive, waiting for the next request

    def data_received(self, data: bytes) -> None:
        if self.connection_cap is not None:
            self.connection_cap.busy(self)
        if self._is_plain_health_check(data):
            self._answer_health(data)
            return
        if self._read_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm_read()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def _is_plain_health_check(self, data: bytes) -> bool:
        """One whole small ``GET /health`` with no body and no Origin (CORS), on an idle connection."""
        if self.health is None or len(data) > _HEALTH_MAX_BYTES or not data.startswith(_HEALTH_LINES) or \
                not data.endswith(b"\r\n\r\n") or data.count(b"\r\n") > _HEALTH_MAX_LINES:
            return False  # anything unusual (many headers, a body) takes the full stack and its limits
        if self.conn.our_state is not h11.IDLE or self.conn.their_state is not h11.IDLE or self.conn.trailing_data[0]:
            return False
        lowered = data.lower()
        return data.count(b"\r\n\r\n") == 1 and not any(
            name in lowered for name in (b"\norigin:", b"\ncontent-length:", b"\ntransfer-encoding:", b"\nupgrade:"))

    def _answer_health(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        self._disarm_read()
        self.conn.receive_data(data)
        try:
            request = self.conn.next_event()
            end = self.conn.next_event()
        except h11.RemoteProtocolError:
            self.send_400_response("Invalid HTTP request received.")
            return
        assert isinstance(request, h11.Request) and isinstance(end, h11.EndOfMessage), (request, end)
        status, body = self.health()
        headers = [(b"content-length", str(len(body)).encode())]
        if body:
            headers.append((b"content-type", b"application/json"))
        output = self.conn.send(h11.Response(status_code=status, headers=headers,
                                            reason=http.HTTPStatus(status).phrase.encode()))
        output += self.conn.send(h11.Data(data=body)) if body else b""
        output += self.conn.send(h11.EndOfMessage())
        self.transport.write(output)
        self.server_state.total_requests += 1
        if self.conn.our_state is h11.MUST_CLOSE:
            self.transport.close()
            return
        self.conn.start_next_cycle()
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
        if self.connection_cap is not None:
            self.connection_cap.idle(self)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state in _RECEIVED:
            self._disarm_read()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None and self.write_timeout > 0:
            self._write_deadline = self.loop.call_later(self.write_timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write()

    def _arm_read(self) -> None:
        self._disarm_read()
        if self.read_timeout > 0:
            self._read_deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _disarm_read(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state in _RECEIVED:
            return
        cycle = self.cycle
        responding = cycle is not None and not cycle.response_complete and cycle.response_started
        if not responding:
            self.transport.write(_timeout_response())
        self._close("read")

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        if not self.transport.is_closing():
            self._close("write")

    def _close(self, kind: str) -> None:
        """Close now; after a write timeout the unsent buffer is dropped (the client is not reading it)."""
        logger.debug("closing a connection from %s: %s timeout", self.client, kind)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the handler's receive() now reports a disconnect, send() is a no-op
            cycle.message_event.set()
        if kind == "write":
            self.transport.abort()
        else:
            self.transport.close()  # sends the 408 first
        if self.on_timeout is not None:
            self.on_timeout(kind)
