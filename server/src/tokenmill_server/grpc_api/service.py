"""The gRPC service (grpc.aio) on ``--grpc-port``: streaming Generate (cancel = abort), GetModelInfo,
and the standard grpc.health.v1 service. API keys are checked by an interceptor (Bearer metadata),
health excepted; errors map to gRPC status codes."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import ValidationError

import tokenmill
from tokenmill.sampling_params import SamplingParams
from tokenmill.structured import StructuredOutputsParams
from tokenmill_server.error_handlers import validation_message
from tokenmill_server.errors import ApiError
from tokenmill_server.generation import engine_errors, new_request_id
from tokenmill_server.grpc_api import tokenmill_pb2 as pb
from tokenmill_server.grpc_api import tokenmill_pb2_grpc as pb_grpc
from tokenmill_server.protocol.common import MAX_GRAMMAR_CHARS, SamplingFields
from tokenmill_server.sampling import build_sampling_params, check_common, check_context, check_model, check_token_ids
from tokenmill_server.server_args import ServerSettings
from tokenmill_server.state import ServerState

SERVICE_NAME = "tokenmill.v1.Tokenmill"
# SamplingParams fields that are unset unless given (the model's generation defaults apply)
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "n", "seed",
                    "skip_special_tokens")
_OPEN_METHODS = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")


def status_code(error: ApiError) -> grpc.StatusCode:
    if error.code == "server_overloaded":
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
            404: grpc.StatusCode.NOT_FOUND, 503: grpc.StatusCode.UNAVAILABLE}.get(error.status,
                                                                                 grpc.StatusCode.INTERNAL)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED unless ``authorization: Bearer <key>`` names a configured key."""

    def __init__(self, api_keys: tuple[str, ...]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in api_keys]

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "Invalid or missing API key.")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny)

    def _allowed(self, metadata: Any) -> bool:
        for name, value in metadata or ():
            parts = str(value).split() if name == "authorization" else []
            if len(parts) == 2 and parts[0].lower() == "bearer":
                digest = hashlib.sha256(parts[1].encode()).digest()
                found = False
                for key in self._digests:
                    found |= hmac.compare_digest(digest, key)
                if found:
                    return True
        return False

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if details.method in _OPEN_METHODS or self._allowed(details.invocation_metadata):
            return await continuation(details)
        return self._deny_stream if details.method.endswith("/Generate") else self._deny


class TokenmillServicer(pb_grpc.TokenmillServicer):
    """Generate and GetModelInfo over the server's AsyncLLM."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        model = self.state.model
        return pb.ModelInfo(model=model.name, max_model_len=model.max_model_len, vocab_size=model.vocab_size,
                            max_logprobs=model.max_logprobs, version=tokenmill.__version__)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        state = self.state
        request_id = new_request_id("grpc")
        try:
            state.check_accepting()
            check_model(request.model or None, state.model)
            ids, text = await self._prompt(request)
            params = self._params(request)
            check_context(len(ids), params.max_tokens, state.model)
            with engine_errors(state.metrics):
                stream = state.engine.add_request(request_id, ids, params, prompt_text=text)
        except ApiError as error:
            await context.abort(status_code(error), error.message)
        try:
            with engine_errors():
                async for output in stream:
                    for completion in output.outputs:
                        yield pb.GenerateResponse(
                            index=completion.index, text=completion.text, token_ids=completion.token_ids,
                            finish_reason=completion.finish_reason or "",
                            stop_reason="" if completion.stop_reason is None else str(completion.stop_reason),
                            prompt_tokens=len(ids), completion_tokens=len(completion.token_ids),
                            cached_tokens=output.num_cached_tokens or 0)
        except ApiError as error:
            await context.abort(status_code(error), error.message)
        finally:
            state.engine.abort(request_id)

    async def _prompt(self, request: pb.GenerateRequest) -> tuple[list[int], str | None]:
        engine = self.state.engine
        if request.WhichOneof("input") == "token_ids":
            return list(request.token_ids.ids), None
        if not request.text:
            raise ApiError(400, "The prompt cannot be empty.", param="text")
        return await self.state.prompt_bounds.encode(engine, request.text, "text"), request.text

    def _params(self, request: pb.GenerateRequest) -> SamplingParams:
        """The request's SamplingParams, validated by the HTTP API's own schema and checks (one validator:
        the same bounds, finite numbers, caps and token-id ranges, and the same messages)."""
        given = request.sampling_params
        fields: dict[str, Any] = {name: getattr(given, name) for name in _OPTIONAL_FIELDS if given.HasField(name)}
        fields.update(presence_penalty=given.presence_penalty, frequency_penalty=given.frequency_penalty,
                      min_tokens=given.min_tokens, stop=list(given.stop), stop_token_ids=list(given.stop_token_ids),
                      ignore_eos=given.ignore_eos, include_stop_str_in_output=given.include_stop_str_in_output,
                      logit_bias={str(k): v for k, v in given.logit_bias.items()} or None)
        max_tokens = fields.pop("max_tokens", None)
        try:
            sampling = SamplingFields.model_validate(fields)
        except ValidationError as error:
            message, param = validation_message(list(error.errors()))
            raise ApiError(400, message, param=param) from None
        state = self.state
        check_common(sampling, state.limits, state.model)
        constraint = _constraint(given.structured_outputs) if given.HasField("structured_outputs") else None
        params = build_sampling_params(sampling, state.limits, state.model, max_tokens=max_tokens, logprobs=None,
                                       stream=request.stream, constraint=constraint)
        check_token_ids(params, state.model)
        return params


def _constraint(given: pb.StructuredOutputs) -> StructuredOutputsParams:
    """The message's one constraint, checked like the HTTP API's structured_outputs (400 otherwise)."""
    kind = given.WhichOneof("constraint")
    if kind is None:
        raise ApiError(400, "structured_outputs needs one constraint.", param="structured_outputs")
    value = list(given.choice.values) if kind == "choice" else getattr(given, kind)
    if isinstance(value, str) and len(value) > MAX_GRAMMAR_CHARS:
        raise ApiError(400, f"structured_outputs.{kind} is longer than {MAX_GRAMMAR_CHARS} characters.",
                       param="structured_outputs")
    try:
        constraint = StructuredOutputsParams(**{"json" if kind == "json_schema" else kind: value},
                                             disable_any_whitespace=given.disable_any_whitespace)
        constraint.check_grammar()
    except ValueError as error:
        raise ApiError(400, str(error), param="structured_outputs") from None
    return constraint


class GrpcServer:
    """The running gRPC server and its health service."""

    def __init__(self, server: grpc.aio.Server, health_servicer: Any) -> None:
        self.server = server
        self.health = health_servicer

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            asyncio.ensure_future(self.health.set(service, status))

    async def stop(self, grace: float) -> None:
        await self.server.stop(grace)


async def start_grpc_server(state: ServerState, settings: ServerSettings) -> GrpcServer:
    """Bind ``settings.grpc_port`` on ``settings.host`` and start serving."""
    interceptors = [ApiKeyInterceptor(settings.api_keys)] if settings.api_keys else []
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", settings.max_body_bytes),
        ("grpc.max_send_message_length", settings.max_body_bytes)])
    pb_grpc.add_TokenmillServicer_to_server(TokenmillServicer(state), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(f"{settings.host}:{settings.grpc_port}") == 0:
        raise OSError(f"cannot bind the gRPC port {settings.grpc_port}")
    await server.start()
    grpc_server = GrpcServer(server, health_servicer)
    grpc_server.set_serving(True)
    return grpc_server
