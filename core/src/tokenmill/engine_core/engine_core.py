"""EngineCore: the busy part of the engine — schedule, execute, update — with no tokenizer (only the
vocabulary, loaded for grammars when a request first asks for structured output).

It receives tokenized requests (EngineCoreRequest) and emits token-level results
(EngineCoreOutputs); detokenization and stop strings belong to the front end. Embedding requests
(``add_embedding``) run through the same scheduler as pooling requests (``EmbeddingJobs``); their
vectors are collected with ``take_embeddings``. It runs in the caller's process (LLM) or in its own
process behind a ZMQ socket (the server).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Sequence

import numpy as np

from tokenmill.engine_core.embedding_jobs import EmbeddingJobs
from tokenmill.layers.pooling import PoolingConfig
from tokenmill.request import Request, RequestStatus
from tokenmill.runner.model_runner import ModelRunner
from tokenmill.scheduler.scheduler import Scheduler
from tokenmill.spec_decode.proposer import DraftSlot
from tokenmill.structured.grammar_compiler import StructuredOutputCompiler
from tokenmill.structured.grammar_queue import GrammarQueue
from tokenmill.wire import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest

logger = logging.getLogger("tokenmill")
_IDLE_GRAMMAR_WAIT_S = 0.01  # with nothing else to run, wait this long for a grammar instead of spinning


class EngineCore:
    """Owns the scheduler and the model runner; ``step`` is one iteration of the engine loop."""

    def __init__(self, scheduler: Scheduler, runner: ModelRunner, on_request_finished=None, on_stop=None,
                 num_speculative_tokens: int = 0, grammars: StructuredOutputCompiler | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        # compiles requests' structured-output constraints off the loop (None: constraints are refused)
        self._grammar_queue = GrammarQueue(grammars) if grammars is not None else None
        self.num_speculative_tokens = num_speculative_tokens  # drafts proposed per request and step (0: off)
        self._to_propose: list[Request] = []  # requests that got tokens last step: draft for them next
        self._on_request_finished = on_request_finished
        self._on_stop = on_stop
        self._pending: list[EngineCoreOutput] = []  # results of aborts, sent with the next step
        self._embeddings = EmbeddingJobs()

    def add_request(self, message: EngineCoreRequest) -> None:
        """Queue a request; raises ValueError when it can never run (too long for the cache, or a
        structured-output constraint that does not compile); TypeError on an encoder, which only embeds."""
        if self.runner.is_encoder:
            raise TypeError(f"{type(self.runner.model).__name__} is an encoder-only embedding model: use LLM.embed, "
                            f"not generate")
        request = Request.from_engine_core_request(message)
        if request.sampling_params.structured_outputs is None:
            self.scheduler.add_request(request, fork_of=message.fork_of)
            return
        if self._grammar_queue is None:
            raise ValueError("this engine does not offer structured outputs.")
        self.scheduler.check_admissible(request)
        self._grammar_queue.submit(request, message.fork_of)  # scheduled once its grammar is compiled

    def add_embedding(self, request_id: str, prompts: Sequence[Sequence[int]], pooling: PoolingConfig) -> None:
        """Queue an embedding request: each prompt becomes a pooling request of the scheduler. Raises
        ValueError, adding none of them, when one can never run (empty, too long for the cache)."""
        requests = self._embeddings.open(request_id, prompts, pooling)
        try:
            for request in requests:
                self.scheduler.check_admissible(request)
        except ValueError:
            self._embeddings.close([request_id])
            raise
        for request in requests:
            self.scheduler.add_request(request)

    def take_embeddings(self) -> dict[str, np.ndarray]:
        """The float32 rows [prompts, hidden] of every embedding request finished since the last call."""
        return self._embeddings.take_finished()

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests at any stage; each gets a final "abort" output at the next step (an embedding
        request is dropped without one)."""
        self.scheduler.finish_requests(self._embeddings.close(request_ids), RequestStatus.FINISHED_ABORTED)
        self._finish(request_ids, RequestStatus.FINISHED_ABORTED, None)

    def finish_requests(self, request_ids: list[str], stop_reason: str | None) -> None:
        """End requests the front end found finished (a stop string matched)."""
        self._finish(request_ids, RequestStatus.FINISHED_STOPPED, stop_reason)

    def _finish(self, request_ids: list[str], status: RequestStatus, stop_reason: str | None) -> None:
        compiling = self._grammar_queue.remove(request_ids) if self._grammar_queue is not None else []
        for request in compiling:
            request.finish(status, stop_reason)
        for request in [*compiling, *self.scheduler.finish_requests(request_ids, status, stop_reason)]:
            self._emit_finished(request)

    def _emit_finished(self, request: Request) -> None:
        """Queue a finished request's final (token-less) output and report it finished."""
        self._pending.append(EngineCoreOutput(request.request_id, [], finish_reason=request.finish_reason,
                                              stop_reason=request.stop_reason,
                                              num_cached_tokens=request.num_cached_tokens))
        self._report_finished(request)

    def has_unfinished_requests(self) -> bool:
        compiling = self._grammar_queue is not None and len(self._grammar_queue) > 0
        return self.scheduler.has_unfinished_requests() or bool(self._pending) or compiling

    def step(self) -> EngineCoreOutputs:
        """Schedule one step, run the model on it, apply the sampled tokens; return what changed."""
        self._admit_compiled()
        outputs, self._pending = self._pending, []
        if self._to_propose:  # drafted here, not after last step's update, so its tokens went out first
            self._propose(self._to_propose)
            self._to_propose = []
        scheduler_output = self.scheduler.schedule()
        if not scheduler_output.is_empty or scheduler_output.finished_request_ids:
            result = self.runner.execute(scheduler_output)
            updates = self.scheduler.update(scheduler_output, result.sampled_token_ids)
            if self.num_speculative_tokens:
                self._to_propose = [u.request for u in updates if not u.finished]
            for update in updates:
                request = update.request
                request_id = request.request_id
                if request.pooling is not None:
                    self._embeddings.complete(request_id, result.pooled[request_id].numpy())
                    continue
                logprobs = result.logprobs.get(request_id)
                outputs.append(EngineCoreOutput(
                    request_id,
                    update.new_token_ids,
                    new_logprobs=logprobs[: len(update.new_token_ids)] if logprobs else None,
                    prompt_logprobs=result.prompt_logprobs.get(request_id),
                    finish_reason=request.finish_reason if update.finished else None,
                    stop_reason=request.stop_reason if update.finished else None,
                    num_cached_tokens=request.num_cached_tokens,
                ))
                if update.finished:
                    self._report_finished(request)
            for request_id, entries in result.prompt_logprobs.items():
                if not any(o.request_id == request_id for o in outputs):
                    outputs.append(EngineCoreOutput(request_id, [], prompt_logprobs=entries))
        return EngineCoreOutputs(outputs, timestamp=time.time(), scheduler_stats=self.scheduler.stats())

    def _propose(self, requests: list[Request]) -> None:
        """Ask the runner's proposer for the next step's draft tokens of the requests that may speculate."""
        slots = []
        for request in requests:
            if request.grammar is not None:  # drafts would bypass its token masks
                continue
            budget = self.scheduler.draft_budget(request, self.num_speculative_tokens)
            if budget:
                block_ids = self.scheduler.kv_cache_manager.get_block_ids(request.request_id)
                slots.append(DraftSlot(request, block_ids, budget))
        for request_id, token_ids in self.runner.propose(slots).items():
            self.scheduler.requests[request_id].spec_token_ids = token_ids

    def _admit_compiled(self) -> None:
        """Schedule the constrained requests whose grammar is ready; abort those whose constraint failed."""
        queue = self._grammar_queue
        if queue is None or not len(queue):
            return
        idle = not self.scheduler.has_unfinished_requests()
        for request, fork_of, grammar in queue.ready(_IDLE_GRAMMAR_WAIT_S if idle else 0.0):
            if isinstance(grammar, ValueError):
                logger.warning("request %s: %s", request.request_id, grammar)
                request.finish(RequestStatus.FINISHED_ABORTED)
                self._emit_finished(request)
                continue
            request.grammar = grammar
            self.scheduler.add_request(request, fork_of=fork_of)

    def _report_finished(self, request: Request) -> None:
        if self._on_request_finished is not None:
            self._on_request_finished(request_id=request.request_id, finish_reason=request.finish_reason,
                                      num_prompt_tokens=request.num_prompt_tokens,
                                      num_output_tokens=request.num_output_tokens)

    def shutdown(self) -> None:
        """Release the model's caches, hand the objects frozen at build (``build_engine_core``) back to
        the garbage collector, and tell plugins the engine stopped."""
        self.runner.shutdown()
        if self._grammar_queue is not None:
            self._grammar_queue.shutdown()
        gc.unfreeze()
        if self._on_stop is not None:
            self._on_stop()
