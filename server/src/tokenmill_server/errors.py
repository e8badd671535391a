"""API errors and their two wire shapes: OpenAI's on ``/v1/*`` (and everything else), Anthropic's on
``/v1/messages``. Messages are sanitized: no stack traces, no filesystem paths."""

from __future__ import annotations

import json
import re
from typing import Any

ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
                 429: "rate_limit_error", 501: "not_implemented_error", 503: "service_unavailable_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# absolute paths under the usual roots, and Windows drive paths
_PATH = re.compile(r"(?:[A-Za-z]:\\|/)(?:home|root|tmp|usr|opt|var|work|etc|mnt|srv|private|Users|proc|dev|lib|nix|"
                   r"data|app|workspace|scratch|run|snap|Library|System)(?:[/\\][^\s'\",;)\]}]*)?")


def sanitize(message: str, limit: int = 2000) -> str:
    """``message`` without filesystem paths, cut to ``limit`` characters, and always encodable as UTF-8
    (a lone surrogate echoed from a request becomes its ``\\udXXX`` escape text)."""
    message = _PATH.sub("<path>", message).encode("utf-8", "backslashreplace").decode("utf-8")
    return message if len(message) <= limit else message[: limit - 3] + "..."


class ApiError(Exception):
    """An error with an HTTP status that the client should see (its message is sanitized)."""

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = sanitize(message)
        self.type = type
        self.param = sanitize(param, 200) if param is not None else None
        self.code = code
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(feature: str, param: str) -> ApiError:
    """A 400 for a field whose feature this server does not have (never silently ignored)."""
    return ApiError(400, f"{feature} is not supported by this server yet.", param=param, code="unsupported_parameter")


def model_not_found(name: str) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def context_length_exceeded(limit: int, prompt_tokens: int, max_tokens: int | None) -> ApiError:
    if max_tokens is None:
        message = (f"This model's maximum context length is {limit} tokens. However, your request has "
                   f"{prompt_tokens} input tokens. Please reduce the length of the input.")
    else:
        message = (f"This model's maximum context length is {limit} tokens. However, you requested "
                   f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the input, {max_tokens} for the "
                   f"completion). Please reduce the length of the input or of max_tokens.")
    return ApiError(400, message, param="max_tokens" if max_tokens is not None else "input_tokens",
                    code="context_length_exceeded")


def overloaded(message: str, retry_after: int = 1) -> ApiError:
    return ApiError(503, message, code="server_overloaded", headers={"Retry-After": str(retry_after)})


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, code="service_unavailable", headers={"Retry-After": "5"})


def is_anthropic_path(path: str) -> bool:
    return path in ANTHROPIC_PATHS


def error_status(error: ApiError, path: str) -> int:
    """Anthropic clients expect 529 for an overloaded server."""
    if error.status == 503 and error.code == "server_overloaded" and is_anthropic_path(path):
        return 529
    return error.status


def error_body(error: ApiError, path: str) -> dict[str, Any]:
    """The JSON error object for ``path``: Anthropic's shape on its routes, OpenAI's elsewhere."""
    status = error_status(error, path)
    if is_anthropic_path(path):
        kind = error.type or _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}
    kind = error.type or _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}}


def error_bytes(error: ApiError, path: str) -> bytes:
    return json.dumps(error_body(error, path)).encode()
