"""Prompts far beyond the context (issue 28, item 1): refused before they are tokenized, with one line,
while other requests keep being served, and the API process's memory returns near its baseline."""

import json
import threading
import time

import httpx
import psutil
import pytest
from server_live import LiveServer, assert_still_serving

from tokenmill_server.prompt_bounds import CHARS_PER_TOKEN, PromptBounds, encode_cut, text_size

BIG = "hello world " * 2_500_000  # 30 MB
MAX_MODEL_LEN = 512  # the tiny model's
BIG_BODIES = {
    "/v1/completions": {"prompt": BIG, "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": BIG}], "max_tokens": 1},
    "/v1/messages": {"max_tokens": 1, "messages": [{"role": "user", "content": BIG}]},
}


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """A tiny-model server with the default body limit (32 MiB), so a 30 MB prompt reaches the handlers."""
    live = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--log-interval", "0",
                      log=tmp_path_factory.mktemp("big-prompts") / "server.log")
    try:
        yield live.wait_ready()
    finally:
        live.stop()


def api_rss(server) -> int:
    return psutil.Process(server.process.pid).memory_info().rss


@pytest.mark.parametrize("path", list(BIG_BODIES))
def test_a_big_prompt_is_refused_at_once_while_small_requests_are_served(server, path):
    baseline = api_rss(server)
    body = json.dumps(BIG_BODIES[path]).encode()  # encoded here, so the client's own work does not slow the others
    answer: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: answer.append(httpx.post(
        server.url + path, content=body, headers={"content-type": "application/json"}, timeout=300)))
    sender.start()
    small_latencies = []
    while sender.is_alive() or not small_latencies:
        started = time.monotonic()
        small = httpx.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1}, timeout=30)
        small_latencies.append(time.monotonic() - started)
        assert small.status_code == 200, small.text
    sender.join()
    assert max(small_latencies) < 2.0, small_latencies
    assert answer[0].status_code == 400, answer[0].text[:300]
    message = answer[0].json()["error"]["message"]  # the same key in the OpenAI and the Anthropic shapes
    assert "30000" in message and f"{MAX_MODEL_LEN} tokens" in message and "\n" not in message, message
    time.sleep(1.0)
    assert api_rss(server) < baseline + (256 << 20), (baseline >> 20, api_rss(server) >> 20)
    assert_still_serving(server.url)


@pytest.mark.parametrize("path, body", [
    ("/tokenize", {"prompt": "x" * 20_000}),
    ("/tokenize", {"messages": [{"role": "user", "content": "x" * 20_000}]}),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "x" * 20_000}]}),
    ("/v1/embeddings", {"input": ["short", "x" * 20_000]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "function", "function": {"name": "f", "description": "x" * 20_000}}],
                              "tool_choice": "required"}),
])
def test_every_route_that_tokenizes_bounds_its_text(server, path, body):
    answer = httpx.post(server.url + path, json=body, timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    assert "characters long" in answer.text and "at most 16416 characters" in answer.text


def test_a_prompt_within_the_character_bound_but_too_many_tokens_gives_its_true_count(server):
    prompt = " ".join(str(i) for i in range(2000))  # ~9k characters, several thousand tokens
    answer = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    count = int(error["message"].split("your request has ")[1].split()[0])
    tokenized = httpx.post(server.url + "/tokenize", json={"prompt": prompt}, timeout=30).json()["count"]
    assert count == tokenized > MAX_MODEL_LEN + 1  # the real count, not the cut at max_model_len + 1


def test_truncate_prompt_tokens_keeps_the_end_of_a_prompt_beyond_the_bound(server):
    prompt = "x" * 100_000 + " The quick brown fox"
    answer = httpx.post(server.url + "/v1/completions",
                        json={"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 8}, timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["usage"]["prompt_tokens"] == 8
    ending = httpx.post(server.url + "/tokenize", json={"prompt": " The quick brown fox", "add_special_tokens": False},
                        timeout=30).json()["tokens"]
    echoed = httpx.post(server.url + "/v1/completions",
                        json={"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0,
                              "truncate_prompt_tokens": len(ending)}, timeout=30).json()
    assert "".join(echoed["choices"][0]["logprobs"]["tokens"]) == " The quick brown fox"


def test_a_token_id_prompt_longer_than_the_context_is_refused_before_its_ids_are_checked(server):
    answer = httpx.post(server.url + "/v1/completions", json={"prompt": [1] * 100_000, "max_tokens": 1}, timeout=30)
    assert answer.status_code == 400 and "100000 input tokens" in answer.text


# -- the bounds themselves, on the tiny model's real tokenizer -------------------------------------------------------

def test_bounds_follow_the_model_length():
    bounds = PromptBounds(512)
    assert bounds.max_tokens == 513 and bounds.max_chars == 513 * CHARS_PER_TOKEN
    bounds.check_text("x" * bounds.max_chars, "prompt")
    with pytest.raises(Exception, match="characters long") as raised:
        bounds.check_text("x" * (bounds.max_chars + 1), "prompt")
    assert raised.value.status == 400 and raised.value.param == "prompt"


def test_encode_cut_keeps_the_first_ids_and_the_true_count(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = " ".join(str(i) for i in range(300))
    full = tokenizer.encode(text, add_special_tokens=True)
    ids, count = encode_cut(tokenizer, text, True, 10)
    assert ids == full[:10] and count == len(full)
    assert encode_cut(tokenizer, text, True, None) == (full, len(full))


def test_conversation_size_counts_every_string_the_template_sees():
    conversation = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "",
                                                         "tool_calls": [{"function": {"arguments": "{}"}}]}]
    assert text_size(conversation) == len("roleusercontentabc") + len("roleassistantcontenttool_calls") + \
        len("functionarguments{}")
    bounds = PromptBounds(4)  # 5 * 32 = 160 characters
    bounds.check_conversation(conversation)  # 49 + 2 * 32 = 113
    with pytest.raises(Exception, match="conversation is"):
        bounds.check_conversation(conversation, {"tools": [{"description": "d" * 50}]})
