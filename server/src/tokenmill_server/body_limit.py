"""Request-size limits as a pure ASGI middleware: too many headers get 431; a declared
Content-Length over the body limit is refused before a byte of the body is read; a chunked body is
cut off once it passes the limit. (uvicorn's h11 parser already refuses oversized header blocks.)"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenmill_server.errors import ApiError, error_bytes, error_status


class BodyTooLarge(HTTPException):
    """The body grew past the limit while being read (an HTTPException, so the framework's body
    parsing passes it on as a 413 instead of calling it a parse error)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"The request body is larger than the limit of {max_bytes} bytes.")


class BodyLimitMiddleware:
    """413 for bodies over ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_headers: int = 256) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_headers = max_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", ())
        if len(headers) > self.max_headers:
            await self._refuse(scope, send, 431)
            return
        for name, value in headers:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > self.max_bytes:
                    await self._refuse(scope, send, 413 if declared > 0 else 400)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, send, 413)

    async def _refuse(self, scope: Scope, send: Send, status: int) -> None:
        path = scope.get("path", "")
        message = {413: f"The request body is larger than the limit of {self.max_bytes} bytes.",
                   431: f"The request has more than {self.max_headers} headers."}.get(
            status, "The Content-Length header is invalid.")
        error = ApiError(status, message, code="request_too_large" if status in (413, 431) else None)
        body = error_bytes(error, path)
        await send({"type": "http.response.start", "status": error_status(error, path),
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
