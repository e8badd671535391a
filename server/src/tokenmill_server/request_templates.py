"""RequestTemplates: request chat templates rendered within bounds on threads of their own.

With ``--trust-request-chat-template``, a template that comes with a request renders within an
output-size and a time bound.

A template from a request is code from the client: it renders in a ``BoundedSandbox``
(``tokenmill.tokenizer.template_sandbox``), on one of ``workers`` threads apart from the tokenizer's
and the event loop, so a slow template holds neither other requests' tokenization nor their I/O.
Past ``timeout`` the request gets a 400 and the rendering stops at its next check; while all workers
are busy, further request templates get a 503 instead of queueing. The rendered text is tokenized on
the tokenizer thread like any other prompt."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tokenmill.frontend.async_llm import AsyncLLM
from tokenmill.tokenizer.template_sandbox import TemplateBounds
from tokenmill_server.errors import bad_request, overloaded
from tokenmill_server.generation import engine_errors

# how long past its own deadline a rendering may take to notice it (its checks are frequent)
_GRACE_SECONDS = 0.5


class RequestTemplates:
    """Renders request templates with bounds: ``max_chars`` of output, ``timeout`` seconds each."""

    def __init__(self, max_chars: int, timeout: float, workers: int = 2) -> None:
        self.max_chars = max_chars
        self.timeout = timeout
        self.workers = workers
        self.rendering = 0  # renderings whose thread has not finished (even if their request gave up)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="request-template")

    async def render(self, engine: AsyncLLM, conversation: Sequence[Mapping[str, Any]],
                     options: Mapping[str, Any]) -> tuple[str, list[int]]:
        """The prompt text and ids of ``conversation`` under the request's template (``options``, as for
        ``AsyncLLM.render_chat``); 400 for a template that fails or passes a bound, 503 when busy."""
        if self.rendering >= self.workers:
            raise overloaded("Every worker for request chat templates is busy; retry later.")
        bounds = TemplateBounds(self.max_chars, self.timeout)
        self.rendering += 1
        job = asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(engine.inputs.render_chat, conversation, template_bounds=bounds, **options))
        job.add_done_callback(self._finished)
        try:
            with engine_errors():
                rendered = await asyncio.wait_for(asyncio.shield(job), self.timeout + _GRACE_SECONDS)
        except TimeoutError:
            raise bad_request(f"The chat template did not finish rendering within {self.timeout:g} s.",
                              "chat_template") from None
        finally:
            if not job.done():
                bounds.stop()  # the request gave up (a timeout or a disconnect): so does the rendering
        with engine_errors():
            ids = await engine.run_tokenizer(engine.inputs.chat_token_ids, rendered)
        return rendered.text, ids

    def _finished(self, job: asyncio.Future) -> None:
        self.rendering -= 1
        if not job.cancelled():
            job.exception()  # retrieved: a late failure of an abandoned rendering is not logged as lost
