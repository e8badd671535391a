"""API keys on a live server (reference section 6 B): every route but /health and /metrics, both
key headers where they belong, path and Host tricks, CORS preflight, and gRPC metadata."""

import socket

import grpc
import httpx
import pytest
from server_live import LiveServer, assert_still_serving, free_port

from tokenmill_server.grpc_api import tokenmill_pb2 as pb
from tokenmill_server.grpc_api import tokenmill_pb2_grpc as pb_grpc

KEYS = ("alpha-key", "beta-key")
GOOD = {"Authorization": "Bearer beta-key"}


@pytest.fixture(scope="module")
def keyed(tiny_model, tmp_path_factory):
    grpc_port = free_port()
    server = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--api-key", KEYS[0], "--grpc-port",
                        str(grpc_port), env={"TOKENMILL_API_KEY": KEYS[1]},
                        log=tmp_path_factory.mktemp("auth") / "server.log")
    server.grpc_port = grpc_port
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def still_serving_afterwards(keyed):
    yield
    assert_still_serving(keyed.url, GOOD)


def status(server, method, path, **kwargs):
    return httpx.request(method, server.url + path, timeout=30, **kwargs).status_code


def test_missing_or_wrong_keys_are_401(keyed):
    response = httpx.get(keyed.url + "/v1/models")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    for header in ("Bearer ALPHA-KEY", "Bearer", "Bearer alpha", "Basic alpha-key", "Bearer alpha-key extra"):
        assert status(keyed, "GET", "/v1/models", headers={"Authorization": header}) == 401, header
    empty = raw(keyed, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \r\nConnection: close\r\n\r\n")
    assert empty.startswith(b"HTTP/1.1 401")


def test_both_configured_keys_and_scheme_variants_work(keyed):
    for header in ("Bearer alpha-key", "bearer beta-key", "Bearer   alpha-key"):
        assert status(keyed, "GET", "/v1/models", headers={"Authorization": header}) == 200, header


def test_open_routes(keyed):
    assert status(keyed, "GET", "/health") == 200 and status(keyed, "GET", "/metrics") == 200


@pytest.mark.parametrize("method, path", [("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/version"),
                                          ("POST", "/invocations"), ("POST", "/pooling"), ("GET", "/openapi.json"),
                                          ("POST", "/v1/load_lora_adapter"), ("POST", "/pause"), ("GET", "/docs")])
def test_every_other_route_needs_the_key(keyed, method, path):
    assert status(keyed, method, path) == 401


def raw(server, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(4096)


@pytest.mark.parametrize("target", [b"//v1/models", b"/v1/./models", b"/V1/models", b"/v1/models/", b"/%2Fv1/models",
                                    b"/v1%2Fmodels", b"/health/../v1/models", b"//health"])
def test_path_tricks_are_never_an_authenticated_200(keyed, target):
    reply = raw(keyed, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.split(b" ")[1] in (b"401", b"404"), reply[:200]


def test_host_header_injection_is_401(keyed):
    body = b'{"messages": [{"role": "user", "content": "x"}]}'
    reply = raw(keyed, b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost/v1/models?\r\nContent-Type: "
                       b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert reply.startswith(b"HTTP/1.1 401")


def test_x_api_key_on_anthropic_routes(keyed):
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert status(keyed, "POST", "/v1/messages", json=body, headers={"x-api-key": "alpha-key"}) == 200
    response = httpx.post(keyed.url + "/v1/messages", json=body, headers={"x-api-key": "wrong"})
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert status(keyed, "GET", "/v1/models", headers={"x-api-key": "alpha-key"}) == 401


def test_sdks_authenticate_with_their_default_headers(keyed):
    import anthropic
    import openai

    message = anthropic.Anthropic(base_url=keyed.url, api_key="alpha-key", max_retries=0).messages.create(
        model="tiny-llama", max_tokens=2, messages=[{"role": "user", "content": "hi"}])  # sends x-api-key
    assert message.usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0).messages.create(
            model="tiny-llama", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    bearer = anthropic.Anthropic(base_url=keyed.url, auth_token="beta-key", max_retries=0)
    assert bearer.messages.count_tokens(model="tiny-llama", messages=[{"role": "user", "content": "hi"}]).input_tokens
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key="beta-key", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny-llama"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_cors_preflight_needs_no_key(keyed):
    response = httpx.options(keyed.url + "/v1/chat/completions", headers={
        "Origin": "http://example.com", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert response.status_code in (200, 204)


def test_grpc_needs_the_key_but_health_does_not(keyed):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{keyed.grpc_port}") as channel:
        stub = pb_grpc.TokenmillStub(channel)
        generate = pb.GenerateRequest(text="hi", sampling_params=pb.SamplingParams(max_tokens=1))
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(generate, timeout=10))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=[("authorization", "Bearer nope")])
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        outputs = list(stub.Generate(generate, timeout=30, metadata=[("authorization", "Bearer alpha-key")]))
        assert outputs[0].completion_tokens == 1
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
