"""Streaming correctness, cancellation, backpressure and metrics (reference section 6 H and I)
against a live tiny-model server (max_num_seqs 8, 8 more may wait)."""

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_live import assert_still_serving, json_events, metric_in, metric_value, sse_events

USER = [{"role": "user", "content": "Hello"}]
RUNNING = "tokenmill:num_requests_running{"
WAITING = "tokenmill:num_requests_waiting{"
KV = "tokenmill:kv_cache_usage_perc{"
ABORTS = 'tokenmill:request_success_total{finished_reason="abort"'


@pytest.fixture(autouse=True)
def still_serving_afterwards(tiny_server):
    yield
    assert_still_serving(tiny_server.url)


def stream(server, path, body):
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as response:
        response.read()
        assert response.status_code == 200, response.text
        return response


def wait_for_idle(url, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric_value(url, RUNNING) == 0 and metric_value(url, KV) == 0:
            return True
        time.sleep(0.05)
    return False


def test_chat_stream_with_n_and_usage(tiny_server):
    body = {"messages": USER, "max_tokens": 4, "n": 3, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    response = stream(tiny_server, "/v1/chat/completions", body)
    datas = [data for _, data in sse_events(response)]
    assert datas.count("[DONE]") == 1 and datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert {choice["index"]: choice["delta"]["role"] for choice in chunks[0]["choices"]} == {0: "assistant", 1: "assistant",
                                                                                             2: "assistant"}
    finishes = [(choice["index"], choice["finish_reason"]) for c in chunks for choice in c["choices"] if choice["finish_reason"]]
    assert sorted(finishes) == [(0, "length"), (1, "length"), (2, "length")]
    assert chunks[-1]["choices"] == [] and all(c["usage"] is None for c in chunks[:-1])
    unstreamed = httpx.post(tiny_server.url + "/v1/chat/completions", json={**body, "stream": False,
                                                                            "stream_options": None}, timeout=60).json()
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert chunks[-1]["usage"][key] == unstreamed["usage"][key]
    texts = {i: "" for i in range(3)}
    for c in chunks:
        for choice in c["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
    assert texts == {c["index"]: c["message"]["content"] for c in unstreamed["choices"]}


def test_completion_stream_with_echo_logprobs_and_usage(tiny_server):
    body = {"prompt": "Hello", "max_tokens": 3, "echo": True, "logprobs": 1, "stream": True, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = json_events(stream(tiny_server, "/v1/completions", body))
    text = "".join(choice["text"] for c in chunks for choice in c["choices"])
    assert text.startswith("Hello")
    assert chunks[-1]["usage"]["completion_tokens"] == 3 and all(c["usage"] for c in chunks)
    full = httpx.post(tiny_server.url + "/v1/completions", json={**body, "stream": False, "stream_options": None}).json()
    assert full["choices"][0]["text"] == text


def test_finish_reasons(tiny_server):
    def greedy(**extra):
        body = {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}
        return httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]

    free = greedy()
    assert free["finish_reason"] == "length" and free["stop_reason"] is None
    stop = free["text"][2:4]
    cut = greedy(stop=[stop])
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert stop not in cut["text"] and free["text"].startswith(cut["text"])
    kept = greedy(stop=[stop], include_stop_str_in_output=True)
    assert kept["text"].endswith(stop)
    eos = httpx.post(tiny_server.url + "/tokenize", json={"prompt": "<|im_end|>", "add_special_tokens": False}).json()
    eos_id = eos["tokens"][0]
    ended = greedy(ignore_eos=False, logit_bias={str(eos_id): 100})
    assert ended["finish_reason"] == "stop" and ended["stop_reason"] is None
    token_stop = greedy(stop_token_ids=[7], logit_bias={"7": 100})
    assert token_stop["finish_reason"] == "stop" and token_stop["stop_reason"] == 7


def test_anthropic_stream_order_and_counts(tiny_server):
    body = {"model": "tiny-llama", "max_tokens": 5, "messages": USER, "temperature": 0}
    events = sse_events(stream(tiny_server, "/v1/messages", {**body, "stream": True}))
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert names[1:3] == ["content_block_start", "ping"]
    assert names.index("content_block_stop") == len(names) - 3 and names[-2] == "message_delta"
    assert set(names[3:-3]) <= {"content_block_delta"}
    payloads = [json.loads(data) for _, data in events]
    delta = payloads[-2]
    full = httpx.post(tiny_server.url + "/v1/messages", json=body, timeout=60).json()
    assert delta["usage"]["output_tokens"] == full["usage"]["output_tokens"] == 5
    assert delta["delta"]["stop_reason"] == full["stop_reason"] == "max_tokens"
    streamed_text = "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta")
    assert streamed_text == full["content"][0]["text"]
    counted = httpx.post(tiny_server.url + "/v1/messages/count_tokens", json={"messages": USER}).json()
    assert counted["input_tokens"] == full["usage"]["input_tokens"] + full["usage"]["cache_read_input_tokens"]
    missing = httpx.post(tiny_server.url + "/v1/messages", json={"messages": USER})
    assert missing.status_code == 400 and missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("n", [1, 4])
def test_disconnect_mid_stream_frees_everything(tiny_server, n):
    aborts = metric_value(tiny_server.url, ABORTS)
    body = {"prompt": "Hello", "max_tokens": 480, "ignore_eos": True, "stream": True, "n": n}
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
        assert metric_value(tiny_server.url, RUNNING) == n
    assert wait_for_idle(tiny_server.url)
    assert metric_value(tiny_server.url, ABORTS) == aborts + 1


def test_disconnect_while_waiting_and_nonstreaming(tiny_server):
    async def metric(client, name):  # metric_value without blocking the event loop the streams run on
        return metric_in((await client.get("/metrics")).text, name)

    async def scenario():
        async with httpx.AsyncClient(base_url=tiny_server.url, timeout=60) as client:
            body = {"prompt": "Hello", "max_tokens": 480, "ignore_eos": True, "stream": True}
            holders = [client.stream("POST", "/v1/completions", json=body) for _ in range(8)]
            opened = [await holder.__aenter__() for holder in holders]
            try:
                waiter = asyncio.create_task(client.post("/v1/completions", json={**body, "stream": False}))
                while await metric(client, WAITING) < 1:  # queued behind the 8 running
                    await asyncio.sleep(0.005)
                waiter.cancel()  # hangs up while waiting
                with pytest.raises(asyncio.CancelledError):
                    await waiter
                # a fast host finishes 480 tokens in well under a second: hang up before they end
                assert await metric(client, RUNNING) == 8
            finally:
                for holder in holders:
                    await holder.__aexit__(None, None, None)
            return opened

    aborts = metric_value(tiny_server.url, ABORTS)
    opened = asyncio.run(scenario())
    assert all(r.status_code == 200 for r in opened)
    assert wait_for_idle(tiny_server.url)
    assert metric_value(tiny_server.url, ABORTS) == aborts + 9


def test_abort_storm_leaves_nothing_behind(tiny_server):
    async def storm():
        async with httpx.AsyncClient(base_url=tiny_server.url, timeout=60) as client:
            async def one():
                body = {"prompt": "Hello", "max_tokens": 300, "ignore_eos": True, "stream": True}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    return response.status_code
            return await asyncio.gather(*[one() for _ in range(100)])

    codes = asyncio.run(storm())
    assert set(codes) <= {200, 503}
    assert wait_for_idle(tiny_server.url)


def test_full_queue_answers_503_with_retry_after(tiny_server):
    rejected = metric_value(tiny_server.url, "tokenmill:admission_rejections_total{")

    async def burst(path, body):
        async with httpx.AsyncClient(base_url=tiny_server.url, timeout=60) as client:
            return await asyncio.gather(*[client.post(path, json=body) for _ in range(30)])

    responses = asyncio.run(burst("/v1/completions", {"prompt": "Hi", "max_tokens": 100, "ignore_eos": True}))
    codes = [r.status_code for r in responses]
    assert set(codes) == {200, 503} and codes.count(200) >= 16
    busy = next(r for r in responses if r.status_code == 503)
    assert busy.headers["Retry-After"] == "1" and busy.json()["error"]["code"] == "server_overloaded"
    assert metric_value(tiny_server.url, "tokenmill:admission_rejections_total{") == rejected + codes.count(503)
    responses = asyncio.run(burst("/v1/messages", {"max_tokens": 100, "messages": USER}))
    overloaded = [r for r in responses if r.status_code != 200]
    assert overloaded and all(r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error" for r in overloaded)


def test_metrics_parse_and_count_requests(tiny_server):
    def families():
        text = httpx.get(tiny_server.url + "/metrics").text
        return {f.name: f for f in text_string_to_metric_families(text)}

    def sample(fams, family, suffix):
        return sum(s.value for s in fams[family].samples if s.name == family + suffix)

    before = families()
    for _ in range(3):
        httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    after = families()
    assert sample(after, "tokenmill:e2e_request_latency_seconds", "_count") == \
        sample(before, "tokenmill:e2e_request_latency_seconds", "_count") + 3
    for family in ("tokenmill:prompt_tokens", "tokenmill:generation_tokens", "tokenmill:request_success",
                   "tokenmill:prefix_cache_queries", "tokenmill:num_preemptions"):
        assert sample(after, family, "_total") >= sample(before, family, "_total")
    assert sample(after, "tokenmill:generation_tokens", "_total") >= sample(before, "tokenmill:generation_tokens", "_total") + 6
    for name in ("tokenmill:time_to_first_token_seconds", "tokenmill:inter_token_latency_seconds",
                 "tokenmill:kv_cache_usage_perc", "tokenmill:num_requests_waiting"):
        assert name in after


def test_reused_client_request_ids_do_not_cross_talk(tiny_server):
    async def run():
        async with httpx.AsyncClient(base_url=tiny_server.url, timeout=60) as client:
            prompts = ["Paris is", "One two", "The quick", "Hello my"]
            responses = await asyncio.gather(*[client.post("/v1/completions", json={
                "prompt": p, "max_tokens": 4, "temperature": 0, "request_id": "same", "echo": True}) for p in prompts])
            return prompts, [r.json() for r in responses]

    prompts, bodies = asyncio.run(run())
    assert len({b["id"] for b in bodies}) == 4
    for prompt, body in zip(prompts, bodies, strict=True):
        assert body["choices"][0]["text"].startswith(prompt)


def test_throughput_is_logged_while_busy(tiny_server):
    httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 20, "ignore_eos": True},
               timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "generation throughput:" not in tiny_server.log_tail(100_000):
        time.sleep(0.2)
    line = next(line for line in tiny_server.log_tail(100_000).splitlines() if "generation throughput:" in line)
    assert "running:" in line and "waiting:" in line and "KV cache usage:" in line
