"""Schemathesis against /openapi.json of the live tiny-model server: schema-valid requests to every
operation never get a 5xx. Generation stays short (max_tokens, n and batch sizes are clamped)."""

import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings

schemathesis = pytest.importorskip("schemathesis")  # a test-only tool (tokenmill-server[test])
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

pytestmark = pytest.mark.slow
_CAPS = {"max_tokens": 2, "max_completion_tokens": 2, "n": 2, "best_of": 2, "min_tokens": 1}


def clamp(body):
    """Keep generated requests cheap: at most 2 tokens, 2 sequences, 2 prompts."""
    if not isinstance(body, dict):
        return
    if "messages" in body and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 2  # chat's default is the rest of the context
    for key, cap in _CAPS.items():
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool):
            body[key] = max(min(body[key], cap), 0 if key in ("max_tokens", "min_tokens") else 1)
    if isinstance(body.get("prompt"), list):
        body["prompt"] = body["prompt"][:2]
    if isinstance(body.get("messages"), list):
        body["messages"] = body["messages"][:3]
    best_of, n = body.get("best_of"), body.get("n")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (best_of, n)):
        body["best_of"] = max(best_of, n)  # negative cases may put any type in either field
    min_tokens = body.get("min_tokens", 0)
    if isinstance(body.get("max_tokens"), int) and isinstance(min_tokens, int) and min_tokens > body["max_tokens"]:
        body["min_tokens"] = 0


def test_no_server_errors(tiny_server):
    # schemathesis' pytest plugin does not load under this pytest, so each operation gets its own
    # hypothesis run over the operation's strategy: positive data (schema-valid), then negative
    schema = schemathesis.openapi.from_url(tiny_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    statuses: dict[str, list[int]] = {}
    for operation in operations:
        label = operation.label
        for mode, examples in ((GenerationMode.POSITIVE, 40), (GenerationMode.NEGATIVE, 15)):
            if mode is GenerationMode.NEGATIVE and operation.method.upper() in ("GET", "HEAD"):  # nothing to negate
                continue

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                      phases=[Phase.generate])
            def call(case):
                clamp(case.body)
                response = case.call_and_validate(checks=[not_a_server_error], timeout=120)
                statuses.setdefault(case.operation.label, []).append(response.status_code)

            started = time.monotonic()
            call()
            print(f"{label} {mode.value}: {time.monotonic() - started:.1f} s")
    print({label: (len(codes), sorted(set(codes))) for label, codes in statuses.items()})
    for label in ("POST /v1/completions", "POST /v1/chat/completions", "POST /v1/messages"):
        assert 200 in statuses[label], f"no generated request to {label} was valid: {statuses[label]}"
