"""Server-sent events: the frame formats (OpenAI's ``data:`` lines, Anthropic's named events) and a
streaming response that always releases its requests, even when the stream never started, and that
bounds what a slow reader can make the server hold.

Backpressure: a pump task reads the engine's outputs as they come (so nothing piles up in the
engine's per-request queue) and formats them into a per-stream buffer that the connection drains.
If the client reads so slowly that the buffer would pass ``max_pending_bytes`` (a single frame
larger than that is still let through alone), the request is aborted (freeing its KV blocks), the buffered output is dropped, and the stream ends with an error
event in the route's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tokenmill_server.errors import ApiError, error_body, is_anthropic_path

logger = logging.getLogger("tokenmill.server")
DONE = b"data: [DONE]\n\n"


def data_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def named_event(name: str, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"event: {name}\ndata: {body}\n\n".encode()


class StreamGauge:
    """What every stream of a server holds unsent (for /metrics): the total now, the most one
    stream ever held, and how many streams were stopped for reading too slowly."""

    def __init__(self, on_slow_reader: Callable[[], None] | None = None) -> None:
        self.buffered_bytes = 0
        self.max_stream_bytes = 0
        self.slow_reader_aborts = 0
        self.on_slow_reader = on_slow_reader

    def slow_reader_aborted(self) -> None:
        self.slow_reader_aborts += 1
        if self.on_slow_reader is not None:
            self.on_slow_reader()


@dataclass(frozen=True)
class StreamBudget:
    """How much unsent output one stream may hold, and where to account for it."""

    max_pending_bytes: int
    gauge: StreamGauge
    path: str

    def overflow_frames(self) -> bytes:
        """The stream's last frames after an overflow: an error event in the route's shape."""
        error = ApiError(408, f"The client read the stream too slowly: more than {self.max_pending_bytes} bytes of "
                              f"output were waiting to be sent, so the request was stopped.",
                         type="timeout_error", code="slow_reader")
        if is_anthropic_path(self.path):
            return named_event("error", error_body(error, self.path))
        return data_event(error_body(error, self.path)) + DONE


class _BoundedBuffer:
    """The frames of one stream between the engine and the connection (the pump appends, the
    response drains); at most ``budget.max_pending_bytes`` are held."""

    def __init__(self, content: AsyncIterator[bytes], budget: StreamBudget, on_overflow: Callable[[], None]) -> None:
        self.content = content
        self.budget = budget
        self.on_overflow = on_overflow
        self.frames: deque[bytes] = deque()
        self.pending = 0
        self.done = False
        self.ready = asyncio.Event()

    def _account(self, delta: int) -> None:
        self.pending += delta
        gauge = self.budget.gauge
        gauge.buffered_bytes += delta
        gauge.max_stream_bytes = max(gauge.max_stream_bytes, self.pending)

    async def pump(self) -> None:
        """Move the content's frames into the buffer until it ends or would overflow."""
        try:
            async for frame in self.content:
                if self.pending and self.pending + len(frame) > self.budget.max_pending_bytes:
                    self._overflow()
                    return
                self.frames.append(frame)
                self._account(len(frame))
                self.ready.set()
        except Exception:  # the views turn errors into error events; this is a bug
            logger.exception("an event stream failed on %s", self.budget.path)
            raise
        finally:
            try:
                close = getattr(self.content, "aclose", None)
                if close is not None:
                    await close()  # runs the view's cleanup, which aborts its requests
            finally:
                self.done = True
                self.ready.set()

    def _overflow(self) -> None:
        self.budget.gauge.slow_reader_aborted()
        logger.warning("stopped a stream on %s: the client read too slowly (%d bytes waiting)", self.budget.path,
                       self.pending)
        self.on_overflow()
        self.release()
        frames = self.budget.overflow_frames()
        self.frames.append(frames)
        self._account(len(frames))

    async def drain(self) -> AsyncIterator[bytes]:
        """Everything buffered so far as one chunk per wake-up, until the pump is done."""
        while True:
            if self.frames:
                chunk = b"".join(self.frames)
                self.frames.clear()
                self._account(-len(chunk))
                yield chunk
                continue
            if self.done:
                return
            self.ready.clear()
            await self.ready.wait()

    def release(self) -> None:
        self._account(-self.pending)
        self.frames.clear()


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response; ``on_close`` runs when it ends for any reason (finished,
    client gone, cancelled, too slow a reader), so requests whose stream never started are aborted too."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None], budget: StreamBudget) -> None:
        self._buffer = _BoundedBuffer(content, budget, on_close)
        super().__init__(self._buffer.drain(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._buffer.pump())
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not pump.done():
                pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            self._buffer.release()
            self._on_close()
