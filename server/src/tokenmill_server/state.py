"""ServerState: what every handler needs — the engine, the model's and the server's limits, metrics,
and whether the server is draining. Stored on ``app.state.server``."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from tokenmill.frontend.async_llm import AsyncLLM
from tokenmill_server.errors import ApiError, bad_request, unavailable
from tokenmill_server.event_stream import StreamBudget
from tokenmill_server.generation import engine_errors
from tokenmill_server.metrics import ServerMetrics
from tokenmill_server.prompt_bounds import PromptBounds
from tokenmill_server.request_templates import RequestTemplates
from tokenmill_server.sampling import ModelLimits, RequestLimits


def model_limits(engine: AsyncLLM) -> ModelLimits:
    ready = engine.ready
    return ModelLimits(name=ready.served_model_name, max_model_len=ready.max_model_len, vocab_size=ready.vocab_size,
                       max_logprobs=ready.max_logprobs, scheduling_policy=ready.scheduling_policy,
                       generation_defaults=dict(ready.generation_defaults))


@dataclass
class ServerState:
    """Shared by all handlers of one app."""

    engine: AsyncLLM
    limits: RequestLimits
    metrics: ServerMetrics
    model: ModelLimits
    max_stream_buffer_bytes: int = 1 << 20
    started: float = field(default_factory=time.time)
    draining: bool = False
    tokenizing: int = 0  # sequences of admitted requests not yet handed to the engine
    request_templates: RequestTemplates | None = None  # set when the server trusts request templates

    @contextlib.contextmanager
    def admission(self, num_sequences: int) -> Iterator[None]:
        """503 if ``num_sequences`` more would overfill the engine's queue, counting requests still
        being tokenized (a burst is refused before it tokenizes); the block keeps their place."""
        with engine_errors(self.metrics):
            self.engine.check_admission(num_sequences, pending=self.tokenizing)
        self.tokenizing += num_sequences
        try:
            yield
        finally:
            self.tokenizing -= num_sequences

    @property
    def prompt_bounds(self) -> PromptBounds:
        """How much request text this model's prompts may have before it is tokenized."""
        return PromptBounds(self.model.max_model_len)
    async def render_chat(self, conversation: Sequence[Mapping[str, Any]],
                          options: Mapping[str, Any]) -> tuple[str, list[int]]:
        """The prompt text and ids of a conversation: a template from the request renders bounded, on
        its own threads (``RequestTemplates``); the model's on the tokenizer thread."""
        if options.get("chat_template") is not None and self.request_templates is not None:
            return await self.request_templates.render(self.engine, conversation, options)
        with engine_errors():
            return await self.engine.render_chat(conversation, **options)

    def stream_budget(self, path: str) -> StreamBudget:
        """The unsent-output bound of one event stream on ``path``."""
        return StreamBudget(self.max_stream_buffer_bytes, self.metrics.streams, path)

    def check_accepting(self) -> None:
        """503 while shutting down or after the engine died."""
        if self.draining:
            raise unavailable("The server is shutting down; retry on another instance.")
        if self.engine.is_dead:
            raise unavailable("The engine is not running.")

    def check_can_generate(self) -> None:
        """400 on the generation routes when the model is an encoder-only embedding model."""
        if not self.engine.ready.can_generate:
            raise bad_request(f"The model `{self.model.name}` is an embedding model; it cannot generate. Use "
                              f"/v1/embeddings.", "model")

    @property
    def healthy(self) -> bool:
        return not self.draining and not self.engine.is_dead

    def health(self) -> tuple[int, bytes]:
        """The status and body of /health: 200 and nothing while serving, else 503 and the reason."""
        if self.healthy:
            return 200, b""
        reason = "shutting down" if self.draining else "engine stopped"
        return 503, json.dumps({"status": reason}).encode()


def server_state(request: Request) -> ServerState:
    state: Any = getattr(request.app.state, "server", None)
    if state is None:
        raise ApiError(503, "The server is starting.")
    return state
