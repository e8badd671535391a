"""Chat templates from requests (--trust-request-chat-template) against a live tiny-model server:
bounded in output and time, rendered off the event loop and the tokenizer thread (issue 28)."""

import asyncio
import time

import httpx
import pytest
import server_live
from server_live import LiveServer, assert_still_serving

USER = [{"role": "user", "content": "hi"}]
NESTED = "{% for i in range(600) %}{% for j in range(600) %}{% for k in range(600) %}{% endfor %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def trusting_server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("template-server") / "server.log"
    server = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--max-num-seqs", "4",
                        "--trust-request-chat-template", "--request-chat-template-timeout", "3", log=log)
    try:
        yield server.wait_ready()
        assert_still_serving(server.url)
    finally:
        server.stop()


def chat(server, template, **extra):
    return httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": USER, "max_tokens": 2, "chat_template": template, **extra})


def test_a_request_template_renders(trusting_server):
    response = chat(trusting_server, server_live.CHATML, ignore_eos=True)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2
    tokens = httpx.post(trusting_server.url + "/tokenize", timeout=60, json={
        "messages": USER, "chat_template": "{{ messages[0].content }}!", "return_token_strs": True}).json()
    assert "".join(tokens["token_strs"]).replace("Ġ", " ") == "hi!"


@pytest.mark.parametrize("template", ["{{ 'a' * 10**9 }}", "{% set s = 'a' * 999999 %}{{ [s, s, s] }}",
                                      "{{ 'x'|center(10**9) }}"])
def test_an_output_bomb_is_refused_quickly(trusting_server, template):
    started = time.monotonic()
    response = chat(trusting_server, template)
    assert response.status_code == 400 and time.monotonic() - started < 2, response.text
    assert "chat template" in response.json()["error"]["message"]
    assert trusting_server.process.poll() is None


def test_a_slow_template_blocks_nobody_and_ends_at_the_time_bound(trusting_server):
    async def run():
        async with httpx.AsyncClient(base_url=trusting_server.url, timeout=60) as client:
            started = time.monotonic()
            slow = asyncio.ensure_future(client.post("/v1/chat/completions", json={
                "messages": USER, "max_tokens": 2, "chat_template": NESTED}))
            await asyncio.sleep(0.3)
            answered = []
            while not slow.done():  # other requests, model templates and plain prompts, answer meanwhile
                before = time.monotonic()
                other = await client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1})
                completion = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
                assert other.status_code == completion.status_code == 200
                answered.append(time.monotonic() - before)
                await asyncio.sleep(0.1)
            return await slow, time.monotonic() - started, answered

    response, took, answered = asyncio.run(run())
    assert response.status_code == 400 and "within 3 s" in response.json()["error"]["message"], response.text
    assert 2.5 < took < 5
    # a blocked tokenizer thread or event loop would hold these for the whole 3 s
    assert len(answered) >= 2 and max(answered) < 1.5, answered
