"""/v1/embeddings beside generation on the tiny random Llama (``tiny_server``): last-token pooled
vectors equal the in-process ``LLM.embed``'s, and embedding requests answered while a greedy
completion runs, their prompts scheduled in the same steps as pooling requests, leave its tokens
unchanged (a pooling request writes only its own blocks and never reads the prefix cache)."""

import threading
import time

import httpx
import numpy as np
import openai
import pytest

pytestmark = pytest.mark.slow
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "One two three"]


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _served_name(client):
    return client.models.list().data[0].id


def test_decoder_embeddings_match_the_offline_llm(client, tiny_model):
    from tokenmill import LLM

    response = client.embeddings.create(model=_served_name(client), input=PROMPTS, encoding_format="float")
    served = np.array([d.embedding for d in response.data], dtype=np.float32)
    llm = LLM(str(tiny_model), kv_cache_memory="8MiB")  # the server's defaults: platform dtype, attention backend
    offline = np.array([o.outputs.embedding for o in llm.embed(PROMPTS)], dtype=np.float32)
    assert served.shape == (3, 64)
    np.testing.assert_allclose(served, offline, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="64 dimensions"):
        client.embeddings.create(model=_served_name(client), input="x", dimensions=32)


def _greedy(url):
    response = httpx.post(url + "/v1/completions", timeout=120, json={
        "prompt": PROMPTS[0], "max_tokens": 32, "temperature": 0, "ignore_eos": True,
        "logprobs": 0, "return_tokens_as_token_ids": True})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["tokens"]


def test_embeddings_between_steps_leave_generation_unchanged(tiny_server):
    alone = _greedy(tiny_server.url)
    assert len(alone) == 32
    done = threading.Event()
    answered_during: list[float] = []
    failures: list[str] = []

    def embed_until_done():
        with httpx.Client(timeout=60) as http:
            while not done.is_set():
                reply = http.post(tiny_server.url + "/v1/embeddings", json={"input": PROMPTS * 3})
                if reply.status_code != 200 or len(reply.json()["data"]) != 9:
                    failures.append(reply.text)
                    return
                answered_during.append(time.monotonic())

    embedder = threading.Thread(target=embed_until_done)
    embedder.start()
    try:
        time.sleep(0.05)
        started = time.monotonic()
        beside = _greedy(tiny_server.url)
        finished = time.monotonic()
    finally:
        done.set()
        embedder.join(60)
    assert not failures, failures
    assert any(started < t < finished for t in answered_during), "no embedding was answered during the completion"
    assert beside == alone
