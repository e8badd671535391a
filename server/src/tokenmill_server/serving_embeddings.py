"""``POST /v1/embeddings``: check the request, let the engine core pool the inputs, answer in
OpenAI's shape. Any model serves it: encoders (BERT) pool their bidirectional states, decoders
their last (or mean) hidden states."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.frontend.async_llm import RequestRejectedError
from tokenmill.frontend.embedding_inputs import embedding_response
from tokenmill.frontend.input_processor import PromptTooLongError
from tokenmill_server.errors import ApiError, bad_request
from tokenmill_server.generation import (
    ClientDisconnected,
    check_text,
    engine_errors,
    new_request_id,
    until_disconnected,
)
from tokenmill_server.protocol.embedding import EmbeddingRequest
from tokenmill_server.sampling import check_model
from tokenmill_server.state import ServerState, server_state

logger = logging.getLogger("tokenmill.server")


def _check(body: EmbeddingRequest, state: ServerState) -> list[str | list[int]]:
    ignored = body.ignored_fields()
    if ignored:
        logger.warning("request fields ignored (not part of this API): %s", ", ".join(n[:40] for n in ignored[:10]))
    size = state.engine.ready.embedding_size
    if body.dimensions is not None and body.dimensions != size:
        raise bad_request(f"This model's embeddings have {size} dimensions; dimensions={body.dimensions} is not "
                          f"supported (only {size}).", "dimensions")
    inputs = body.inputs()
    limit = state.limits.max_embedding_inputs
    if len(inputs) > limit:
        raise bad_request(f"At most {limit} inputs are allowed per request, got {len(inputs)}.", "input")
    bounds = state.prompt_bounds
    for item in inputs:
        if isinstance(item, str):
            check_text(bounds.check_text(item, "input", "input"), "input")  # the length first: it costs nothing
    return inputs


async def create_embedding(body: EmbeddingRequest, http: Request) -> Response:
    state = server_state(http)
    state.check_accepting()
    name = check_model(body.model, state.model)
    inputs = _check(body, state)
    work = state.engine.embed(new_request_id("embd"), inputs, max_inputs=state.limits.max_embedding_inputs)
    try:
        with engine_errors(state.metrics):
            try:
                result = await until_disconnected(http, work)
            except PromptTooLongError as error:
                raise ApiError(400, str(error), param="input", code="context_length_exceeded") from None
            except RequestRejectedError:
                raise
            except ValueError as error:
                raise bad_request(str(error), "input") from None
    except ClientDisconnected:
        return Response(status_code=499)
    body_json = embedding_response(result.vectors, sum(result.num_prompt_tokens), body.encoding_format, name)
    return JSONResponse(body_json)
