"""The ASGI middlewares on a bare app: API keys on the raw path, and request-size limits."""

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tokenmill_server.auth import ApiKeyMiddleware
from tokenmill_server.body_limit import BodyLimitMiddleware


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"path": request.url.path, "size": len(body)})


ROUTES = [Route(p, echo, methods=["GET", "POST"]) for p in
          ("/health", "/metrics", "/v1/models", "/v1/messages", "/v1/messages/count_tokens", "/tokenize", "/invocations")]


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def statuses(app, requests) -> list[int]:
    async def run():
        async with client(app) as c:
            return [(await c.request(method, url, headers=headers)).status_code for method, url, headers in requests]

    return asyncio.run(run())


def keyed_app(protect_metrics=False):
    return ApiKeyMiddleware(Starlette(routes=ROUTES), api_keys=["k1", "second-key"], protect_metrics=protect_metrics)


def test_keys_are_required_everywhere_but_health_and_metrics():
    bearer = {"Authorization": "Bearer k1"}
    got = statuses(keyed_app(), [
        ("GET", "/v1/models", {}), ("GET", "/v1/models", bearer), ("GET", "/v1/models", {"Authorization": "Bearer second-key"}),
        ("POST", "/tokenize", {}), ("POST", "/invocations", {}), ("GET", "/unknown", {}),
        ("GET", "/health", {}), ("GET", "/metrics", {}),
    ])
    assert got == [401, 200, 200, 401, 401, 401, 200, 200]
    assert statuses(keyed_app(protect_metrics=True), [("GET", "/metrics", {}), ("GET", "/metrics", bearer)]) == [401, 200]


@pytest.mark.parametrize("header", ["Bearer K1", "Bearer k", "Bearer ", "Bearer", "k1", "Basic k1", "Bearer k1 extra",
                                    "Bearer k1x"])
def test_wrong_or_malformed_keys_are_refused(header):
    assert statuses(keyed_app(), [("GET", "/v1/models", {"Authorization": header})]) == [401]


@pytest.mark.parametrize("header", ["bearer k1", "BEARER k1", "Bearer   k1", " Bearer k1 "])
def test_scheme_is_case_insensitive_and_spaces_are_tolerated(header):
    assert statuses(keyed_app(), [("GET", "/v1/models", {"Authorization": header})]) == [200]


def raw_status(app, path: str, raw_path: bytes, headers=()) -> int:
    """Call the ASGI app with exactly this scope (no client-side URL normalisation)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": raw_path, "root_path": "", "query_string": b"", "headers": list(headers),
             "server": ("test", 80), "client": ("127.0.0.1", 1)}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"]


@pytest.mark.parametrize("path, raw", [("//v1/models", b"//v1/models"), ("/v1/./models", b"/v1/./models"),
                                       ("/V1/models", b"/V1/models"), ("/v1/models/", b"/v1/models/"),
                                       ("//v1/models", b"/%2Fv1/models"), ("/v1/models", b"/v1%2Fmodels"),
                                       ("//health", b"//health"), ("/health/", b"/health/"), ("/HEALTH", b"/HEALTH"),
                                       ("/health\x00", b"/health%00"), ("/./health", b"/./health"),
                                       ("/health/../v1/models", b"/health/../v1/models")])
def test_path_tricks_never_skip_the_key(path, raw):
    assert raw_status(keyed_app(), path, raw) == 401


def test_host_header_cannot_change_the_guarded_path():
    headers = [(b"host", b"localhost/v1/models?")]
    assert raw_status(keyed_app(), "/v1/messages", b"/v1/messages", headers) == 401


def test_x_api_key_only_on_anthropic_routes():
    header = {"x-api-key": "k1"}
    got = statuses(keyed_app(), [("POST", "/v1/messages", header), ("POST", "/v1/messages/count_tokens", header),
                                 ("GET", "/v1/models", header), ("POST", "/v1/messages", {"x-api-key": "nope"})])
    assert got == [200, 200, 401, 401]


def test_401_bodies_use_the_route_shape():
    async def run():
        async with client(keyed_app()) as c:
            return (await c.get("/v1/models")), (await c.post("/v1/messages"))

    openai, anthropic = asyncio.run(run())
    assert openai.json()["error"]["code"] == "invalid_api_key"
    assert openai.headers["www-authenticate"] == "Bearer"
    assert anthropic.json() == {"type": "error", "error": {"type": "authentication_error",
                                                           "message": "Invalid or missing API key."}}


def test_no_keys_means_open():
    app = ApiKeyMiddleware(Starlette(routes=ROUTES), api_keys=[])
    assert statuses(app, [("GET", "/v1/models", {})]) == [200]


def limited_app():
    return BodyLimitMiddleware(Starlette(routes=ROUTES), max_bytes=1000, max_headers=20)


def test_body_limit_by_content_length_and_by_stream():
    async def run():
        async with client(limited_app()) as c:
            small = await c.post("/v1/models", content=b"x" * 1000)
            declared = await c.post("/v1/models", content=b"x" * 1001)

            async def chunks():
                for _ in range(5):
                    yield b"y" * 400

            streamed = await c.post("/v1/models", content=chunks())
            anthropic = await c.post("/v1/messages", content=b"x" * 5000)
            headers = await c.get("/v1/models", headers={f"x-h{i}": "v" for i in range(30)})
            return small, declared, streamed, anthropic, headers

    small, declared, streamed, anthropic, headers = asyncio.run(run())
    assert small.status_code == 200 and small.json()["size"] == 1000
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"
    assert streamed.status_code == 413
    assert anthropic.status_code == 413 and anthropic.json()["error"]["type"] == "request_too_large"
    assert headers.status_code == 431


def test_a_non_ascii_key_matches_its_utf8_header():
    app = ApiKeyMiddleware(Starlette(routes=ROUTES), api_keys=["clé-secrète-🔑"])
    utf8 = "Bearer clé-secrète-🔑".encode()
    assert statuses(app, [("GET", "/v1/models", {"authorization": utf8}),
                          ("GET", "/v1/messages", {"x-api-key": "clé-secrète-🔑".encode()}),
                          ("GET", "/v1/models", {"authorization": "Bearer clé-secrète-🔑".encode("latin-1", "replace")}),
                          ("GET", "/v1/models", {"authorization": b"Bearer cl\xe9-secr\xe8te-\xff"})]) == [200, 200, 401, 401]
