"""API-key authentication as a pure ASGI middleware, decided on the raw ASGI path.

Default deny: every path needs a key except ``/health`` (and ``/metrics`` unless protected), and an
exempt path must equal the routed path exactly, so ``//health``-style or percent-encoded tricks can
only turn an exempt path into a guarded one, never the reverse. Keys are compared in constant time
against every configured key. ``Authorization: Bearer`` works everywhere; ``x-api-key`` on the
Anthropic routes, whose SDK sends it. Keys may be any UTF-8 text: header bytes are read as UTF-8.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from tokenmill_server.errors import ApiError, error_bytes, error_status, is_anthropic_path


def _text(header: bytes) -> str:
    """A header value as the client's UTF-8 text; bytes that are not UTF-8 survive as surrogate escapes,
    so they digest to themselves and match no configured (UTF-8) key."""
    return header.decode("utf-8", "surrogateescape")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class ApiKeyMiddleware:
    """401 unless the request carries one of ``api_keys``; lifespan messages pass through."""

    def __init__(self, app: ASGIApp, api_keys: Iterable[str], protect_metrics: bool = False) -> None:
        self.app = app
        self._digests = [_digest(key) for key in api_keys]
        self._open_paths = {"/health"} if protect_metrics else {"/health", "/metrics"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or not self._digests:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if scope["type"] == "http" and path in self._open_paths and scope.get("root_path", "") == "":
            await self.app(scope, receive, send)
            return
        if self._authorized(scope, path):
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are refused by closing without accepting
        error = ApiError(401, "Invalid or missing API key.", code="invalid_api_key")
        body = error_bytes(error, path)
        await send({"type": "http.response.start", "status": error_status(error, path),
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope, path: str) -> bool:
        candidates = []
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                parts = _text(value).split()
                if len(parts) == 2 and parts[0].lower() == "bearer":
                    candidates.append(parts[1])
            elif name == b"x-api-key" and is_anthropic_path(path):
                candidates.append(_text(value))
        return any(self._matches(candidate) for candidate in candidates)

    def _matches(self, candidate: str) -> bool:
        digest = _digest(candidate)
        found = False
        for key in self._digests:  # no early exit: the time does not depend on which key matched
            found |= hmac.compare_digest(digest, key)
        return found
