"""Hostile input that used to get a 500 or be misread, against a live tiny-model server (issue 28):
lone surrogates, booleans for integers, unbounded id lists, impossible schemas, HEAD requests."""

import httpx
import pytest
from server_live import assert_still_serving

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def still_serving_afterwards(tiny_server):
    yield
    assert_still_serving(tiny_server.url)


def post_raw(server, path: str, body: bytes) -> httpx.Response:
    with httpx.Client(timeout=60) as client:  # one connection: a 500 used to close it
        response = client.post(server.url + path, content=body, headers={"content-type": "application/json"})
        assert client.get(server.url + "/v1/models").status_code == 200
        return response


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", b'{"model": "\\ud800", "prompt": "x", "max_tokens": 1}'),
    ("/v1/chat/completions", b'{"model": "\\udfff", "messages": [{"role": "user", "content": "x"}]}'),
    ("/v1/messages", b'{"model": "\\ud800", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1, "bad_words": ["\\ud800"]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "\\ud800", "text": "x"}]}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "\\udc00": 1}'),
    ("/v1/embeddings", b'{"input": ["ok", "\\ud800"]}'),
])
def test_lone_surrogates_are_one_line_400s(tiny_server, path, body):
    response = post_raw(tiny_server, path, body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "surrogate" in message and "\n" not in message


def test_a_surrogate_pair_is_valid_text(tiny_server):
    body = b'{"prompt": "\\ud83d\\ude00", "max_tokens": 1}'
    assert post_raw(tiny_server, "/v1/completions", body).status_code == 200
