"""No input produces a 5xx (issue 28): every JSON field of the generation endpoints (completions, chat,
messages, embeddings; a few nested fields too) gets hostile strings, numbers and shapes against one
live tiny-model server, which must answer each with a 2xx or 4xx and stay healthy afterwards."""

import asyncio
import copy
import json
import math

import httpx
import pytest
from server_live import assert_still_serving

from tokenmill_server.protocol.anthropic import MessagesRequest
from tokenmill_server.protocol.chat import ChatCompletionRequest
from tokenmill_server.protocol.completion import CompletionRequest
from tokenmill_server.protocol.embedding import EmbeddingRequest

USER = [{"role": "user", "content": "hi"}]
ENDPOINTS = {  # path: (request model, a small valid body)
    "/v1/completions": (CompletionRequest, {"prompt": "Hello", "max_tokens": 2}),
    "/v1/chat/completions": (ChatCompletionRequest, {"messages": USER, "max_tokens": 2, "max_completion_tokens": 2}),
    "/v1/messages": (MessagesRequest, {"messages": USER, "max_tokens": 2}),
    "/v1/embeddings": (EmbeddingRequest, {"input": "Hello"}),
}
NESTED_FIELDS = {  # path: fields inside the body, as key paths (a number is a list index)
    "/v1/chat/completions": [("messages", 0, "role"), ("messages", 0, "content"), ("messages", 0, "name"),
                             ("messages", 0, "tool_calls"), ("messages", 0, "tool_call_id"),
                             ("messages", 0, "content", 0, "type"), ("messages", 0, "content", 0, "text"),
                             ("response_format", "type"), ("response_format", "json_schema"),
                             ("stream_options", "include_usage"), ("structured_outputs", "json"),
                             ("structured_outputs", "regex"), ("structured_outputs", "choice"),
                             ("tool_choice", "function", "name"), ("logit_bias", "5")],
    "/v1/messages": [("messages", 0, "role"), ("messages", 0, "content"), ("messages", 0, "content", 0, "text"),
                     ("system", 0, "text")],
    "/v1/completions": [("prompt", 0), ("prompt", 0, 0), ("logit_bias", "5"), ("stop", 0)],
    "/v1/embeddings": [("input", 0), ("input", 0, 0)],
}
# generation lengths: a missing limit means "the rest of the context", which is long, not hostile
LENGTH_FIELDS = {"max_tokens", "max_completion_tokens"}


def _nested(depth: int, inner=None):
    value = inner
    for _ in range(depth):
        value = [value]
    return value


DEEP = "<5000 nested lists>"  # put in by _encode: json.dumps cannot nest that deep itself


STRINGS = ["\ud800", "x\udfffy", "a\u0000b", "ab " * 330_000, "", "\U0010ffff<|im_end|>"]
NUMBERS = [True, False, math.nan, math.inf, -math.inf, 2**70, -(2**70), -1, 0, 1.5]
SHAPES = [None, [], {}, [1, "x", None], {"a": {"b": [None]}}, _nested(64), DEEP, {"k": _nested(64, {})}]
VALUES = STRINGS + NUMBERS + SHAPES


def _with(body: dict, field: str | tuple, value) -> dict:
    """A copy of ``body`` with ``value`` at ``field`` (a name, or a key path made as needed)."""
    body = copy.deepcopy(body)
    keys = (field,) if isinstance(field, str) else field
    target = body
    for key, following in zip(keys, keys[1:], strict=False):
        if not isinstance(target[key] if isinstance(target, list) else target.get(key), (dict, list)):
            target[key] = [None] if isinstance(following, int) else {}
        target = target[key]
    target[keys[-1]] = value
    return body


def _cases():
    for path, (model, base) in ENDPOINTS.items():
        fields = [name for name in model.model_fields] + NESTED_FIELDS.get(path, [])
        for field in fields:
            for value in VALUES:
                if value is None and field in LENGTH_FIELDS:
                    continue
                yield path, field, value, _with(base, field, value)


def _encode(body) -> bytes:
    # json.dumps's defaults on purpose: lone surrogates as \ud800 escapes, NaN and Infinity as bare words
    return json.dumps(body).replace(json.dumps(DEEP), "[" * 5000 + "]" * 5000).encode()


@pytest.mark.slow
def test_no_hostile_field_value_gets_a_5xx(tiny_server):
    cases = list(_cases())
    assert len(cases) > 2000

    async def run():
        failures, statuses = [], {}
        limit = asyncio.Semaphore(4)  # the tiny server runs 8 sequences: no 503 for lack of room
        async with httpx.AsyncClient(base_url=tiny_server.url, timeout=120) as client:
            async def one(path, field, value, body):
                async with limit:
                    try:
                        response = await client.post(path, content=_encode(body),
                                                     headers={"content-type": "application/json"})
                        status = response.status_code
                    except httpx.HTTPError as error:
                        status = f"{type(error).__name__}"
                statuses[status] = statuses.get(status, 0) + 1
                if not isinstance(status, int) or not (200 <= status < 300 or 400 <= status < 500):
                    failures.append((path, field, repr(value)[:60], status))

            await asyncio.gather(*(one(*case) for case in cases))
        return failures, statuses

    failures, statuses = asyncio.run(run())
    assert not failures, f"{len(failures)} cases failed (statuses {statuses}): {failures[:20]}"
    assert statuses.get(200, 0) > 100 and statuses.get(400, 0) > 1000, statuses
    assert_still_serving(tiny_server.url)
