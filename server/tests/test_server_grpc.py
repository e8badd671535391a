"""The gRPC service (reference section 6 J) on the tiny-model server: Generate (streamed and final),
cancellation as abort, model info, grpc.health.v1, status codes."""

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_live import assert_still_serving, metric_value

from tokenmill_server.grpc_api import tokenmill_pb2 as pb
from tokenmill_server.grpc_api import tokenmill_pb2_grpc as pb_grpc


@pytest.fixture()
def stub(tiny_server):
    with grpc.insecure_channel(f"127.0.0.1:{tiny_server.grpc_port}") as channel:
        yield pb_grpc.TokenmillStub(channel), channel
    assert_still_serving(tiny_server.url)


def request(**params):
    return pb.GenerateRequest(text="Hello", sampling_params=pb.SamplingParams(**params))


def test_generate_streamed_and_final(stub):
    client, _ = stub
    final = list(client.Generate(request(max_tokens=4, temperature=0, ignore_eos=True), timeout=60))
    assert len(final) == 1 and final[0].finish_reason == "length" and final[0].completion_tokens == 4
    streamed = pb.GenerateRequest(text="Hello", stream=True,
                                  sampling_params=pb.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    pieces = list(client.Generate(streamed, timeout=60))
    assert "".join(p.text for p in pieces) == final[0].text
    assert pieces[-1].finish_reason == "length" and sum(len(p.token_ids) for p in pieces) == 4
    ids = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]), sampling_params=pb.SamplingParams(max_tokens=2, n=2))
    outputs = list(client.Generate(ids, timeout=60))
    assert sorted(o.index for o in outputs) == [0, 1] and all(o.prompt_tokens == 3 for o in outputs)


def test_structured_outputs(stub):
    client, _ = stub
    choice = pb.StructuredOutputs(choice=pb.Choices(values=["alpha", "beta"]))
    [reply] = list(client.Generate(request(max_tokens=20, temperature=0, structured_outputs=choice), timeout=60))
    assert reply.text in ("alpha", "beta") and reply.finish_reason == "stop"
    schema = pb.StructuredOutputs(json_schema='{"type": "object", "properties": {"ok": {"type": "boolean"}}, '
                                              '"required": ["ok"], "additionalProperties": false}',
                                  disable_any_whitespace=True)
    [reply] = list(client.Generate(request(max_tokens=30, temperature=0, structured_outputs=schema), timeout=60))
    assert reply.text in ('{"ok": true}', '{"ok": false}', '{"ok":true}', '{"ok":false}'), reply.text


def test_model_info_and_health(stub, tiny_server):
    client, channel = stub
    info = client.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert (info.model, info.max_model_len) == ("tiny-llama", 512)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tokenmill.v1.Tokenmill"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("bad, code", [
    (request(temperature=-1), grpc.StatusCode.INVALID_ARGUMENT),
    (request(n=1000), grpc.StatusCode.INVALID_ARGUMENT),
    (request(stop=[""]), grpc.StatusCode.INVALID_ARGUMENT),
    (request(stop_token_ids=[10**6]), grpc.StatusCode.INVALID_ARGUMENT),
    (request(max_tokens=10_000), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.GenerateRequest(text=""), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.GenerateRequest(model="nope", text="x"), grpc.StatusCode.NOT_FOUND),
    (request(structured_outputs=pb.StructuredOutputs()), grpc.StatusCode.INVALID_ARGUMENT),
    (request(structured_outputs=pb.StructuredOutputs(regex="a(")), grpc.StatusCode.INVALID_ARGUMENT),
    (request(structured_outputs=pb.StructuredOutputs(json_schema='{"type": 5}')), grpc.StatusCode.INVALID_ARGUMENT),
    (request(structured_outputs=pb.StructuredOutputs(choice=pb.Choices())), grpc.StatusCode.INVALID_ARGUMENT),
    (request(structured_outputs=pb.StructuredOutputs(structural_tag='{"type": "structural_tag", "format": 5}')),
     grpc.StatusCode.INVALID_ARGUMENT),
])
def test_errors_map_to_status_codes(stub, bad, code):
    client, _ = stub
    with pytest.raises(grpc.RpcError) as caught:
        list(client.Generate(bad, timeout=30))
    assert caught.value.code() == code


def test_oversized_message_is_resource_exhausted(stub):
    client, _ = stub
    with pytest.raises(grpc.RpcError) as caught:
        list(client.Generate(pb.GenerateRequest(text="x" * (2 << 20)), timeout=30))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_cancel_aborts_the_request(stub, tiny_server):
    client, _ = stub
    aborts = metric_value(tiny_server.url, 'tokenmill:request_success_total{finished_reason="abort"')
    call = client.Generate(pb.GenerateRequest(text="Hello", stream=True, sampling_params=pb.SamplingParams(
        max_tokens=480, ignore_eos=True)), timeout=60)
    next(call)
    call.cancel()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric_value(tiny_server.url, "tokenmill:num_requests_running{") != 0:
        time.sleep(0.05)
    assert metric_value(tiny_server.url, "tokenmill:num_requests_running{") == 0
    assert metric_value(tiny_server.url, 'tokenmill:request_success_total{finished_reason="abort"') == aborts + 1


def test_deadline_exceeded_frees_the_request(stub, tiny_server):
    client, _ = stub
    with pytest.raises(grpc.RpcError) as caught:
        list(client.Generate(pb.GenerateRequest(text="Hello", sampling_params=pb.SamplingParams(
            max_tokens=480, ignore_eos=True)), timeout=0.15))  # 480 tokens take ~0.7 s here
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric_value(tiny_server.url, "tokenmill:num_requests_running{") != 0:
        time.sleep(0.05)
    assert metric_value(tiny_server.url, "tokenmill:num_requests_running{") == 0


@pytest.mark.parametrize("bad", [request(temperature=float("inf")), request(temperature=float("nan")),
                                 request(top_p=float("nan")), request(logit_bias={5: float("nan")}),
                                 request(logit_bias={5: float("inf")}), request(presence_penalty=float("-inf"))])
def test_non_finite_numbers_are_refused_as_over_http(stub, bad):
    client, _ = stub
    with pytest.raises(grpc.RpcError) as caught:
        list(client.Generate(bad, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "finite" in caught.value.details()
