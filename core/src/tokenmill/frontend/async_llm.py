"""AsyncLLM: the asyncio front end of the server — an InputProcessor and an OutputProcessor in this
process, the EngineCore in its own process behind an EngineCoreClient (LLMEngine's structure, async).

Its generate requests live in the OutputProcessor's registry and nowhere else: each carries the
asyncio queue its iterator reads. One task reads the engine's outputs and hands them to the
OutputProcessor, which puts RequestOutputs in those queues (finished embeddings go to their
futures), so the event loop never waits on the model. Tokenization and chat templates run on
``TOKENIZER_THREADS`` threads (a long prompt does not hold up short ones). When the engine dies every
waiting request fails with EngineDeadError instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tokenmill.config import EngineArgs
from tokenmill.frontend.core_client import EngineCoreClient, EngineDeadError
from tokenmill.frontend.embedding_inputs import embedding_prompts
from tokenmill.frontend.input_processor import InputProcessor
from tokenmill.frontend.model_view import (
    front_end_model_config,
    load_tokenizer_or_none,
    tokenizer_from_resolved_config,
)
from tokenmill.frontend.output_processor import OutputProcessor
from tokenmill.frontend.request_outcomes import Embeddings, QueueFullError, RequestAbortedError, RequestRejectedError
from tokenmill.frontend.stats import FinishedRequestStats, IterationStats, StatsListener
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.stats import SchedulerStats
from tokenmill.wire import (
    CANNOT_GENERATE,
    EngineCoreEmbeddings,
    EngineCoreEmbedRequest,
    EngineCoreFailure,
    EngineCoreOutputs,
    EngineCoreRequest,
)

logger = logging.getLogger("tokenmill")

__all__ = ["AsyncLLM", "Embeddings", "EngineDeadError", "FinishedRequestStats", "IterationStats", "QueueFullError",
           "RequestAbortedError", "RequestRejectedError"]

DEFAULT_MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per /v1/embeddings request
TOKENIZER_THREADS = 4  # encodes share the tokenizer read-only (no truncation or padding state is set)


class AsyncLLM:
    """add_request() queues a request and returns its RequestOutputs as an async iterator; abort() stops it."""

    def __init__(self, client: EngineCoreClient, tokenizer: Any, *, max_waiting_requests: int | None = None) -> None:
        assert client.ready is not None, "start the client and wait until it is ready"
        self.client = client
        self.ready = client.ready
        self.tokenizer = tokenizer
        self.model_config = front_end_model_config(self.ready)
        self.inputs = InputProcessor(tokenizer, self.model_config, self.ready.max_logprobs)
        self.outputs = OutputProcessor()
        self.max_waiting_requests = max_waiting_requests
        self.dead_error: EngineDeadError | None = None
        self.last_scheduler_stats: SchedulerStats | None = None
        self._embeddings: dict[str, asyncio.Future[EngineCoreEmbeddings]] = {}
        self._listeners: list[StatsListener] = []
        self._tokenizer_pool = ThreadPoolExecutor(max_workers=TOKENIZER_THREADS, thread_name_prefix="tokenizer")
        self._output_task: asyncio.Task | None = None
        self._death_callbacks: list[Callable[[EngineDeadError], None]] = []

    @classmethod
    async def from_engine_args(cls, args: EngineArgs, *, max_waiting_requests: int | None = None,
                               ready_timeout: float | None = None) -> AsyncLLM:
        """Start the engine process and load the tokenizer meanwhile; return once both are ready."""
        client = await EngineCoreClient.start(args)
        tokenizer_load = asyncio.create_task(asyncio.to_thread(load_tokenizer_or_none, args))
        try:
            await client.wait_ready(ready_timeout)
            tokenizer = await tokenizer_load
            if tokenizer is None:
                tokenizer = await asyncio.to_thread(tokenizer_from_resolved_config, args)
        except BaseException:
            tokenizer_load.cancel()
            client.shutdown()
            raise
        engine = cls(client, tokenizer, max_waiting_requests=max_waiting_requests)
        engine.start()
        return engine

    def start(self) -> None:
        """Start the task that reads the engine's outputs (call from the running event loop)."""
        if self._output_task is None:
            self._output_task = asyncio.get_running_loop().create_task(self._read_outputs(), name="engine-outputs")

    # -- inputs ----------------------------------------------------------------------------------

    async def run_tokenizer(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function`` (tokenization, a chat template) on the tokenizer pool, off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenizer_pool, lambda: function(*args, **kwargs))

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""
        return await self.run_tokenizer(lambda: list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens)))

    async def render_chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> tuple[str, list[int]]:
        """The chat prompt text and its token ids (``InputProcessor.chat`` on the tokenizer pool)."""
        return await self.run_tokenizer(self.inputs.chat, messages, **kwargs)

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults."""
        return SamplingParams(**self.model_config.generation_defaults)

    # -- requests --------------------------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        return self.dead_error is not None

    @property
    def num_unfinished_requests(self) -> int:
        return self.outputs.num_unfinished_requests + len(self._embeddings)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                    prompt_text: str | None = None, priority: int = 0,
                    cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Validate and queue a tokenized request now; return the iterator of its RequestOutputs.

        Raises ValueError (invalid), QueueFullError or EngineDeadError before anything is queued.
        Closing the iterator early (a client disconnect, a cancelled task) aborts all its sequences;
        so does ``abort(request_id)`` for an iterator that was never started.
        """
        queue = self._add(request_id, prompt_token_ids, params, prompt_text, priority, cache_salt)
        return self._outputs(request_id, queue)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       **kwargs: Any) -> AsyncIterator[RequestOutput]:
        """``add_request`` and iterate: yields the request's RequestOutputs until it finishes."""
        async for output in self.add_request(request_id, prompt_token_ids, params, **kwargs):
            yield output

    async def _outputs(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def _add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, prompt_text: str | None,
             priority: int, cache_salt: str | None) -> asyncio.Queue[RequestOutput | BaseException]:
        if self.dead_error is not None:
            raise self.dead_error
        if not self.ready.can_generate:
            raise ValueError(CANNOT_GENERATE)
        params = self.inputs.validate(prompt_token_ids, params)
        self.check_admission(params.num_candidates)
        request = EngineCoreRequest(request_id, prompt_token_ids, params, eos_token_ids=list(self.inputs.eos_token_ids),
                                    arrival_time=time.time(), priority=priority, cache_salt=cache_salt)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        engine_requests = self.outputs.add_request(request, prompt_text, self.tokenizer, queue)
        try:
            self.client.add_requests(engine_requests)
        except EngineDeadError as error:  # it died since the last poll: fail now, and this request with it
            self._die(error)
            raise
        return queue

    def check_admission(self, num_sequences: int, pending: int = 0) -> None:
        """QueueFullError when ``num_sequences`` more would overfill the waiting queue, counting ``pending``
        sequences a caller admitted but has not added yet (callers may check before tokenizing, so a
        full server refuses cheaply); the message counts both kinds."""
        if self.max_waiting_requests is None:
            return
        capacity = self.ready.max_num_seqs + self.max_waiting_requests
        admitted = self.outputs.num_sequences + pending
        if admitted + num_sequences > capacity:
            raise QueueFullError(f"The server is at capacity ({admitted} sequences running, waiting or being "
                                 f"prepared, at most {capacity}); retry later.")

    async def embed(self, request_id: str, inputs: str | Sequence[Any], *,
                    max_inputs: int = DEFAULT_MAX_EMBEDDING_INPUTS) -> Embeddings:
        """Pooled embeddings of OpenAI-style ``inputs`` (a string, strings, token ids, lists of token ids).

        Raises ValueError (empty, too many inputs, too long for max_model_len, out of vocabulary),
        QueueFullError or EngineDeadError before anything is sent; RequestRejectedError when the
        engine refuses them. Cancelling the call drops the request from the engine's queue.
        """
        if self.dead_error is not None:
            raise self.dead_error
        if self.max_waiting_requests is not None and len(self._embeddings) >= self.max_waiting_requests:
            raise QueueFullError(f"The server is at capacity ({len(self._embeddings)} embedding requests waiting); "
                                 f"retry later.")
        prompts = await self.run_tokenizer(embedding_prompts, self.inputs, self.model_config, inputs, max_inputs)
        if self.dead_error is not None:
            raise self.dead_error
        arrival = time.time()
        future: asyncio.Future[EngineCoreEmbeddings] = asyncio.get_running_loop().create_future()
        self._embeddings[request_id] = future
        try:
            self.client.embed(EngineCoreEmbedRequest(request_id, prompts))
            result = await future
        finally:
            if self._embeddings.pop(request_id, None) is not None and self.client.is_alive:
                self.client.abort_requests([request_id])  # cancelled while the engine had it
        counts = [len(p) for p in prompts]
        now = time.time()
        self._emit(IterationStats(now, num_prompt_tokens=sum(counts), finished=[
            FinishedRequestStats("stop", now - arrival, sum(counts), 0)]))
        return Embeddings(result.vectors(), counts)

    def abort(self, request_id: str) -> None:
        """Stop a request (all its sequences); the engine frees its cache blocks at its next step."""
        stats = IterationStats(time.time())
        engine_ids = self.outputs.abort([request_id], stats)
        if not stats.finished:
            return  # finished or aborted already
        if self.client.is_alive:
            self.client.abort_requests(engine_ids)
        self._emit(stats)

    def abort_all(self, message: str) -> int:
        """Abort every request; each waiting generate() or embed() raises RequestAbortedError(message)."""
        requests = self.outputs.requests()
        for request in requests:
            request.queue.put_nowait(RequestAbortedError(message))
            self.abort(request.request_id)
        embeddings = list(self._embeddings)
        for request_id in embeddings:
            self._settle(request_id, RequestAbortedError(message))
        if embeddings and self.client.is_alive:
            self.client.abort_requests(embeddings)
        return len(requests) + len(embeddings)

    # -- outputs ---------------------------------------------------------------------------------

    async def _read_outputs(self) -> None:
        try:
            while True:
                message = await self.client.get_output()
                if isinstance(message, EngineCoreFailure):
                    self._reject(message)
                elif isinstance(message, EngineCoreEmbeddings):
                    self._settle(message.request_id, message)
                else:
                    self._process(message)
        except EngineDeadError as error:
            self._die(error)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug here must not leave requests hanging
            logger.exception("the engine output loop failed")
            self._die(EngineDeadError(f"the engine output loop failed: {type(error).__name__}"))

    def _settle(self, request_id: str, result: EngineCoreEmbeddings | BaseException) -> None:
        """Resolve a waiting embed() with its embeddings or an error (once; late replies are dropped)."""
        future = self._embeddings.pop(request_id, None)
        if future is None or future.done():
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    def _reject(self, failure: EngineCoreFailure) -> None:
        if failure.request_id in self._embeddings:
            self._settle(failure.request_id, RequestRejectedError(failure.message))
            return
        request = self.outputs.request_of(failure.request_id or "")
        if request is None:
            return
        self.abort(request.request_id)
        request.queue.put_nowait(RequestRejectedError(failure.message))

    def _process(self, step: EngineCoreOutputs) -> None:
        now = time.time()
        stats = IterationStats(now, scheduler=step.scheduler_stats)
        if step.scheduler_stats is not None:
            self.last_scheduler_stats = step.scheduler_stats
        _, stopped = self.outputs.process(step.outputs, now, stats)  # every request has a queue
        if stopped:
            self.client.finish_requests(stopped)
        self._emit(stats)

    def _die(self, error: EngineDeadError) -> None:
        if self.dead_error is not None:  # a failed send noticed first
            return
        logger.error("the engine stopped: %s", error)
        self.dead_error = error
        for request in self.outputs.requests():
            self.outputs.abort([request.request_id])
            request.queue.put_nowait(error)
        for request_id in list(self._embeddings):
            self._settle(request_id, error)
        for callback in self._death_callbacks:
            callback(error)

    # -- observers -------------------------------------------------------------------------------

    def add_stats_listener(self, listener: StatsListener) -> None:
        """Call ``listener(IterationStats)`` after every engine step and every abort (must be fast)."""
        self._listeners.append(listener)

    def on_death(self, callback: Callable[[EngineDeadError], None]) -> None:
        """Call ``callback(error)`` once if the engine process dies."""
        self._death_callbacks.append(callback)

    def _emit(self, stats: IterationStats) -> None:
        for listener in self._listeners:
            try:
                listener(stats)
            except Exception:  # a broken metrics listener must not break serving
                logger.exception("a stats listener failed")

    async def shutdown(self) -> None:
        """Stop reading outputs, stop the engine process and the tokenizer thread."""
        if self._output_task is not None:
            self._output_task.cancel()
            await asyncio.gather(self._output_task, return_exceptions=True)
        self.client.shutdown()
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)
