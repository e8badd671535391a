"""build_app: the FastAPI application around a running AsyncLLM.

ASGI layers, outermost first: CORS (answers preflights), API keys, body-size limit, then the
routes. Plugins add routes through the ``register_routes`` hook after the built-in ones.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

import tokenmill
from tokenmill.frontend.async_llm import AsyncLLM
from tokenmill_server.auth import ApiKeyMiddleware
from tokenmill_server.body_limit import BodyLimitMiddleware
from tokenmill_server.error_handlers import install_error_handlers
from tokenmill_server.metrics import ServerMetrics
from tokenmill_server.request_templates import RequestTemplates
from tokenmill_server.routes import router
from tokenmill_server.server_args import ServerSettings
from tokenmill_server.state import ServerState, model_limits

logger = logging.getLogger("tokenmill.server")


def build_app(engine: AsyncLLM, settings: ServerSettings, plugin_manager: Any = None) -> FastAPI:
    """The app, with its ServerState on ``app.state.server`` and metrics fed by the engine."""
    app = FastAPI(title="tokenmill", version=tokenmill.__version__, redoc_url=None,
                  description="OpenAI- and Anthropic-compatible API of a tokenmill engine.")
    app.include_router(router)
    install_error_handlers(app)
    engine.inputs.allow_special_tokens_in_content = settings.allow_special_tokens_in_content
    model = model_limits(engine)
    metrics = ServerMetrics(model.name, model.max_model_len)
    engine.add_stats_listener(metrics.observe)
    templates = RequestTemplates(settings.request_chat_template_max_chars, settings.request_chat_template_timeout) \
        if settings.trust_request_chat_template else None
    app.state.server = ServerState(engine=engine, limits=settings.request_limits(), metrics=metrics, model=model,
                                   max_stream_buffer_bytes=settings.max_stream_buffer_bytes,
                                   request_templates=templates)
    if plugin_manager is not None:
        plugin_manager.hook.register_routes(app=app, engine=engine)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(ApiKeyMiddleware, api_keys=settings.api_keys, protect_metrics=settings.protect_metrics)
    if settings.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"])
    return app
