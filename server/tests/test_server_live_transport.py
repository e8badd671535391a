"""Bad input at the HTTP layer (reference section 6 A and C) against a live tiny-model server."""

import json
import socket
import time

import httpx
import pytest
from server_live import assert_still_serving


@pytest.fixture(autouse=True)
def still_serving_afterwards(tiny_server):
    yield
    assert_still_serving(tiny_server.url)


def post(server, path, **kwargs):
    return httpx.post(server.url + path, timeout=60, **kwargs)


def raw_exchange(server, data: bytes, read_timeout: float = 10.0) -> bytes:
    """Send raw bytes; the reply up to the server's close (or the first 64 KiB, or the timeout)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may refuse and close before reading all of it
        reply = b""
        while len(reply) < 65536:
            try:
                chunk = sock.recv(4096)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            reply += chunk
        return reply


@pytest.mark.parametrize("body", [b'{"model":', b"[]", b'"text"', b"", b"null", b"\xff\xfe\x00{}", b'{"prompt": "a\xff"}'])
def test_malformed_bodies_are_400(tiny_server, body):
    response = post(tiny_server, "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_wrong_content_type_is_400(tiny_server):
    response = post(tiny_server, "/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "x"}]}',
                    headers={"content-type": "text/plain"})
    assert response.status_code == 400


def test_oversized_body_is_413_before_it_is_sent(tiny_server):
    assert post(tiny_server, "/v1/completions", json={"prompt": "x" * (2 << 20)}).status_code == 413
    started = time.monotonic()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n")
    reply = raw_exchange(tiny_server, head)  # no body is ever sent: the answer cannot wait for it
    assert reply.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 5
    assert b"request_too_large" in reply


def test_huge_header_and_many_headers_are_refused(tiny_server):
    assert raw_exchange(tiny_server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 1_000_000 + b"\r\n\r\n"
                        ).split(b" ")[1] in (b"400", b"431")
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(5000))
    assert raw_exchange(tiny_server, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431")


def test_slow_client_does_not_block_others(tiny_server):
    with socket.create_connection(("127.0.0.1", tiny_server.port)) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"pro")
        for _ in range(3):
            started = time.monotonic()
            assert httpx.get(tiny_server.url + "/health", timeout=5).status_code == 200
            assert time.monotonic() - started < 1.0
            slow.sendall(b"m")


def test_deeply_nested_json_is_400_quickly(tiny_server):
    started = time.monotonic()
    body = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = post(tiny_server, "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and time.monotonic() - started < 10


def test_wrong_method_and_unknown_path(tiny_server):
    response = httpx.get(tiny_server.url + "/v1/chat/completions")
    assert response.status_code == 405 and "error" in response.json()
    response = httpx.get(tiny_server.url + "/v1/nothing-here")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


def test_nul_is_accepted_and_lone_surrogates_are_400(tiny_server):
    assert post(tiny_server, "/v1/completions", json={"prompt": "a\u0000b", "max_tokens": 1}).status_code == 200
    body = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'
    response = post(tiny_server, "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "surrogate" in response.json()["error"]["message"]


def test_unknown_model_is_404_in_both_shapes(tiny_server):
    response = post(tiny_server, "/v1/completions", json={"model": "nope", "prompt": "x"})
    assert response.status_code == 404
    assert response.json()["error"] == {"message": "The model `nope` does not exist.", "type": "not_found_error",
                                        "param": "model", "code": "model_not_found"}
    response = post(tiny_server, "/v1/messages", json={"model": "nope", "max_tokens": 1,
                                                       "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    assert httpx.get(tiny_server.url + "/v1/models/nope").status_code == 404


def test_model_omitted_uses_the_default_and_wrong_type_is_400(tiny_server):
    response = post(tiny_server, "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert response.status_code == 200 and response.json()["model"] == "tiny-llama"
    assert post(tiny_server, "/v1/completions", json={"model": 123, "prompt": "x"}).status_code == 400


def test_models_version_and_openapi(tiny_server):
    models = httpx.get(tiny_server.url + "/v1/models").json()
    assert models["data"][0]["id"] == "tiny-llama" and models["data"][0]["max_model_len"] == 512
    assert httpx.get(tiny_server.url + "/v1/models/tiny-llama").json()["id"] == "tiny-llama"
    assert "version" in httpx.get(tiny_server.url + "/version").json()
    schema = httpx.get(tiny_server.url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/tokenize"} <= set(schema["paths"])


def test_errors_never_carry_paths_or_tracebacks(tiny_server, tiny_model):
    responses = [post(tiny_server, "/v1/completions", json={"prompt": [10**9]}),
                 post(tiny_server, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                                 "continue_final_message": True,
                                                                 "add_generation_prompt": False}),
                 post(tiny_server, "/v1/completions", content=b"{", headers={"content-type": "application/json"})]
    for response in responses:
        text = json.dumps(response.json())
        assert str(tiny_model) not in text and "Traceback" not in text and "/tmp" not in text


def test_health_on_kept_alive_connections_http10_and_cors(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=5) as client:  # one kept-alive connection
        for _ in range(3):
            response = client.get("/health")
            assert response.status_code == 200 and response.content == b""
        assert client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200
        assert client.get("/health").status_code == 200
        cors = client.get("/health", headers={"Origin": "http://example.com"})
        assert cors.status_code == 200 and cors.headers["access-control-allow-origin"] == "*"
    reply = raw_exchange(tiny_server, b"GET /health HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\n")
    two = raw_exchange(tiny_server, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
                                    b"Connection: close\r\n\r\n")
    assert two.count(b"HTTP/1.1 200") == 2
