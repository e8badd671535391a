"""ApiRoute: the API's routes, with valid-Unicode JSON bodies and HEAD wherever GET is.

A body is parsed by ``UnicodeCheckedRequest``, which refuses a lone surrogate escape
(``"\\ud800"``) anywhere in it, in a key or a value, as invalid JSON (a 400) before any handler or
model sees the text.

Python's JSON parser accepts lone surrogates, but they cannot be encoded as UTF-8: left in, they
fail later, where they are tokenized, matched, or echoed into an error message."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

# a \uD800-\uDFFF escape: its pair (if it has one) is checked on the parsed value
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _is_invalid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def holds_lone_surrogate(value: Any) -> bool:
    """Whether a parsed JSON value holds a string (key or value) that is not valid Unicode; iterative,
    so any nesting depth the parser accepted is walked without recursion."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _is_invalid_text(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


class UnicodeCheckedRequest(Request):
    """A request whose ``json()`` raises ``JSONDecodeError`` (FastAPI's 400) for a lone surrogate."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            value = json.loads(body)
            match = _SURROGATE_ESCAPE.search(body)
            if match is not None and holds_lone_surrogate(value):
                raise json.JSONDecodeError("a lone surrogate escape is not valid Unicode",
                                           body.decode("utf-8", "replace"), match.start())
            self._json = value
        return self._json


class ApiRoute(APIRoute):
    """The API's route class: bodies are parsed by ``UnicodeCheckedRequest``, and a GET route answers
    HEAD as well (as GET, the server sending no body), as load balancers' health checks expect."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if "GET" in self.methods:
            self.methods.add("HEAD")

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            return await handler(UnicodeCheckedRequest(request.scope, request.receive))

        return checked
