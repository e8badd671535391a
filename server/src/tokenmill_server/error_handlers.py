"""Exception handlers: every error leaves the server in the route's error shape, with status 400 for
request validation (as vLLM, not FastAPI's 422) and a bare "Internal server error" for bugs."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from tokenmill_server.errors import ApiError, error_body, error_status

logger = logging.getLogger("tokenmill.server")
_HTTP_MESSAGES = {404: "Not found.", 405: "Method not allowed.", 413: None, 400: None}


def error_response(error: ApiError, request: Request) -> JSONResponse:
    path = request.scope.get("path", "")
    return JSONResponse(error_body(error, path), status_code=error_status(error, path), headers=error.headers)


def _location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts)


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) from pydantic's error list, without echoing the input values."""
    messages, param = [], None
    for error in errors[:5]:
        where = _location(tuple(error.get("loc", ())))
        text = str(error.get("msg", "invalid value"))
        if error.get("type") == "json_invalid":
            text = f"Invalid JSON: {error.get('ctx', {}).get('error', 'cannot be parsed')}"
            where = ""
        param = param or where or None
        messages.append(f"{where}: {text}" if where else text)
    if len(errors) > 5:
        messages.append(f"and {len(errors) - 5} more errors")
    return "; ".join(messages) or "Invalid request.", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error, request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(error.errors()))
        return error_response(ApiError(400, message, param=param), request)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        message = _HTTP_MESSAGES.get(error.status_code) or str(error.detail)
        if error.status_code == 400 and error.detail == "There was an error parsing the body":
            message = "The request body could not be parsed (it must be a UTF-8 JSON object)."
        code = "request_too_large" if error.status_code == 413 else None
        return error_response(ApiError(error.status_code, message, code=code, headers=dict(error.headers or {})),
                              request)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s", request.scope.get("path"))
        return error_response(ApiError(500, "Internal server error.", type="server_error"), request)
