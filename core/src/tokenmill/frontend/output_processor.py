"""OutputProcessor: the front end's one registry of unfinished requests, and engine-core outputs ->
RequestOutputs (no model).

Every front end (``LLMEngine``, ``AsyncLLM``) keeps its requests here and nowhere else: an abort,
a finish and an engine death all go through it. Per request it detokenizes incrementally, matches
stop strings across token boundaries, turns logprobs entries into per-position dicts with token
texts, and folds the n (or best_of) child sequences of a parallel-sampling request into one
RequestOutput.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgspec

from tokenmill.frontend.parallel_sampling import fan_out
from tokenmill.frontend.request_state import RequestState
from tokenmill.frontend.sequence_state import SequenceState
from tokenmill.frontend.stats import IterationStats
from tokenmill.outputs import RequestOutput
from tokenmill.tokenizer.bad_words import bad_words_token_ids
from tokenmill.wire import EngineCoreOutput, EngineCoreRequest


class OutputProcessor:
    """Tracks every unfinished request between the engine core and the user.

    ``add_request`` returns the engine requests to run: the request itself, or for ``n`` > 1 /
    ``best_of`` one child per candidate (``parallel_sampling.fan_out``). ``process`` consumes one
    step's EngineCoreOutputs: it puts each RequestOutput in its request's queue, or returns it when
    the request has none, together with the engine ids to finish because a stop string ended them
    (the engine only knows token-level stops). A request leaves the registry when it finishes or is
    aborted.
    """

    def __init__(self) -> None:
        self._requests: dict[str, RequestState] = {}
        self._sequences: dict[str, tuple[RequestState, SequenceState]] = {}  # by engine-core request id
        self._num_sequences = 0  # engine requests of the registered requests (finished children included)

    def add_request(
        self, request: EngineCoreRequest, prompt: str | None, tokenizer: Any | None = None, queue: Any | None = None
    ) -> list[EngineCoreRequest]:
        """Start tracking a request; return the engine requests to submit (``fan_out``: the request
        itself, or one child per candidate for ``n`` > 1 / ``best_of``).

        ``bad_words`` not yet tokenized are tokenized here (``bad_words_token_ids``), since the
        sampler has no tokenizer. ``queue`` (an asyncio.Queue) receives the request's RequestOutputs
        instead of ``process``'s result.
        """
        request_id, params = request.request_id, request.sampling_params
        if request_id in self._requests:
            raise ValueError(f"Request id {request_id!r} is already running.")
        if tokenizer is None and params.detokenize and params.stop:
            raise ValueError("Stop strings need a tokenizer to detokenize the output.")
        if params.bad_words and params.bad_words_token_ids is None:
            if tokenizer is None:
                raise ValueError("bad_words need a tokenizer; pass bad_words_token_ids instead.")
            params = params.clone(bad_words_token_ids=bad_words_token_ids(tokenizer, params.bad_words))
            request = msgspec.structs.replace(request, sampling_params=params)
        state = RequestState(request_id, prompt, list(request.prompt_token_ids), params, tokenizer,
                             request.arrival_time, queue)
        engine_requests = fan_out(request)
        for index, engine_request in enumerate(engine_requests):
            sequence = SequenceState(index, engine_request.sampling_params, state.prompt_token_ids, tokenizer,
                                     params.logprobs is not None)
            state.sequences.append(sequence)
            state.engine_ids.append(engine_request.request_id)
            self._sequences[engine_request.request_id] = (state, sequence)
        self._requests[request_id] = state
        self._num_sequences += len(engine_requests)
        return engine_requests

    def process(
        self, engine_outputs: Iterable[EngineCoreOutput], now: float | None = None, stats: IterationStats | None = None
    ) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs; return (RequestOutputs of requests without a queue, engine ids to
        finish). ``stats`` (when given) counts the step's tokens, latencies and finished requests."""
        now = time.time() if now is None else now
        touched: dict[str, list[SequenceState]] = {}
        counted: set[str] = set()  # requests whose first output of this step was recorded
        to_abort: list[str] = []
        for output in engine_outputs:
            entry = self._sequences.get(output.request_id)
            if entry is None:
                continue  # aborted, or finished by a stop string while this step was in flight
            request, sequence = entry
            request.record(output, now, stats, request.request_id not in counted)
            if output.new_token_ids:
                counted.add(request.request_id)
            stop_string = sequence.update(output)
            if stop_string is not None and not output.finished:
                to_abort.append(output.request_id)
            if sequence.finished:
                del self._sequences[output.request_id]
            if output.new_token_ids or sequence.finished:
                touched.setdefault(request.request_id, []).append(sequence)
        request_outputs = []
        for request_id, sequences in touched.items():
            request = self._requests[request_id]
            if request.finished:
                request.metrics.finished_time = now
                self._remove(request)
            request_output = request.make_output(sequences)
            if request_output is None:
                continue
            if request.queue is None:
                request_outputs.append(request_output)
            else:
                request.queue.put_nowait(request_output)
            if request_output.finished and stats is not None:
                reason = next((c.finish_reason for c in request_output.outputs if c.finish_reason), "stop")
                stats.finished.append(request.finished_stats(reason, now))
        return request_outputs, to_abort

    def abort(self, request_ids: Iterable[str], stats: IterationStats | None = None) -> list[str]:
        """Stop tracking user requests; return the engine ids the engine core must abort. ``stats``
        (when given) records each request that was still running as finished by "abort"."""
        engine_ids = []
        for request_id in request_ids:
            request = self._requests.get(request_id)
            if request is None:
                continue
            self._remove(request)
            engine_ids += [e for e in request.engine_ids if self._sequences.pop(e, None) is not None]
            if stats is not None:
                stats.finished.append(request.finished_stats("abort", stats.timestamp))
        return engine_ids

    def _remove(self, request: RequestState) -> None:
        del self._requests[request.request_id]
        self._num_sequences -= len(request.engine_ids)

    def request_of(self, engine_id: str) -> RequestState | None:
        """The unfinished request an engine-core id belongs to (None: finished or unknown)."""
        entry = self._sequences.get(engine_id)
        return None if entry is None else entry[0]

    def requests(self) -> list[RequestState]:
        """The unfinished requests, oldest first (a copy: aborting while iterating is safe)."""
        return list(self._requests.values())

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    @property
    def num_sequences(self) -> int:
        """Engine requests the unfinished requests were fanned out into (what admission counts)."""
        return self._num_sequences

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)
