"""The HTTP routes: OpenAI (/v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings),
Anthropic (/v1/messages, /v1/messages/count_tokens), and /tokenize, /detokenize, /health, /version,
/metrics. An embedding model (encoder-only) answers the generation routes with a 400."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

import tokenmill
from tokenmill_server.api_route import ApiRoute
from tokenmill_server.conversation import openai_conversation, template_options
from tokenmill_server.errors import bad_request, model_not_found
from tokenmill_server.generation import check_text, engine_errors
from tokenmill_server.protocol.anthropic import CountTokensRequest, MessagesRequest
from tokenmill_server.protocol.chat import ChatCompletionRequest
from tokenmill_server.protocol.completion import CompletionRequest
from tokenmill_server.protocol.embedding import EmbeddingRequest
from tokenmill_server.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from tokenmill_server.sampling import check_model
from tokenmill_server.serving_chat import create_chat_completion
from tokenmill_server.serving_completions import create_completion
from tokenmill_server.serving_embeddings import create_embedding
from tokenmill_server.serving_messages import count_tokens, create_message
from tokenmill_server.state import server_state

router = APIRouter(route_class=ApiRoute)
_STREAMING = {200: {"description": "A JSON body, or an event stream when stream is true.",
                    "content": {"application/json": {}, "text/event-stream": {}}}}
_ERRORS = {code: {"description": text} for code, text in
           ((400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
            (413, "Body too large"), (503, "Overloaded, shutting down, or the engine stopped"))}


@router.get("/health", responses={503: {"description": "Shutting down, or the engine stopped"}})
async def health(request: Request) -> Response:
    """200 (empty) while the engine runs and the server accepts requests, else 503."""
    status, body = server_state(request).health()
    return Response(body, status_code=status, media_type="application/json" if body else None)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": tokenmill.__version__}


def _model_card(request: Request) -> dict[str, Any]:
    state = server_state(request)
    name = state.model.name
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "tokenmill", "root": name,
            "parent": None, "max_model_len": state.model.max_model_len, "permission": []}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(request)]}


@router.get("/v1/models/{model}", responses={404: {"description": "Unknown model"}})
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    card = _model_card(request)
    if model != card["id"]:
        raise model_not_found(model)
    return card


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(server_state(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.post("/v1/completions", responses={**_STREAMING, **_ERRORS})
async def completions(body: CompletionRequest, request: Request) -> Response:
    server_state(request).check_can_generate()
    return await create_completion(body, request)


@router.post("/v1/chat/completions", responses={**_STREAMING, **_ERRORS})
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    server_state(request).check_can_generate()
    return await create_chat_completion(body, request)


@router.post("/v1/embeddings", responses=_ERRORS)
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    """Pooled embeddings of text or token ids, as floats or base64 float32."""
    return await create_embedding(body, request)


@router.post("/v1/messages", responses={**_STREAMING, **_ERRORS})
async def messages(body: MessagesRequest, request: Request) -> Response:
    server_state(request).check_can_generate()
    return await create_message(body, request)


@router.post("/v1/messages/count_tokens", responses=_ERRORS)
async def messages_count_tokens(body: CountTokensRequest, request: Request) -> Response:
    return await count_tokens(body, request)


@router.post("/tokenize", responses=_ERRORS)
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    """Token ids of a prompt, or of chat messages rendered with the chat template."""
    state = server_state(request)
    check_model(body.model, state.model)
    engine = state.engine
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("Pass exactly one of prompt and messages.", "prompt")
    bounds = state.prompt_bounds  # a text the model cannot take is refused untokenized, as on the other routes
    with engine_errors():
        if body.prompt is not None:
            add_special = True if body.add_special_tokens is None else body.add_special_tokens
            bounds.check_text(body.prompt, "prompt")
            ids = await engine.encode(check_text(body.prompt, "prompt"), add_special_tokens=add_special)
        else:
            options = template_options(body.chat_template, body.chat_template_kwargs, body.add_generation_prompt,
                                       body.continue_final_message, state.limits)
            conversation = openai_conversation(body.messages)
            bounds.check_conversation(conversation, options)
            text, ids = await state.render_chat(conversation, options)
            if body.add_special_tokens:
                ids = await engine.encode(bounds.check_text(text, "messages"), add_special_tokens=True)
    result: dict[str, Any] = {"count": len(ids), "max_model_len": state.model.max_model_len, "tokens": ids}
    if body.return_token_strs:
        result["token_strs"] = await engine.run_tokenizer(engine.tokenizer.convert_ids_to_tokens, ids)
    return result


@router.post("/detokenize", responses=_ERRORS)
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state = server_state(request)
    check_model(body.model, state.model)
    bad = next((t for t in body.tokens if t >= state.model.vocab_size), None)
    if bad is not None:
        raise bad_request(f"Token id {bad} is out of vocabulary (the vocabulary has {state.model.vocab_size} tokens).",
                          "tokens")
    text = await state.engine.run_tokenizer(state.engine.tokenizer.decode, body.tokens)
    return {"prompt": text}
