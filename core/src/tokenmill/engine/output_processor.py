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
from collections.abc import Iterable, Sequence
from typing import Any

from tokenmill.engine.frontend_stats import IterationStats
from tokenmill.engine.messages import EngineCoreOutput
from tokenmill.engine.request_state import RequestState
from tokenmill.engine.sequence_state import SequenceState
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams
from tokenmill.tokenizer.bad_words import bad_words_token_ids


def child_request_id(index: int, parent_id: str) -> str:
    """The engine-core id of the ``index``-th sequence of a request sampled more than once."""
    return f"{index}_{parent_id}"


class OutputProcessor:
    """Tracks every unfinished request between the engine core and the user.

    ``add_request`` returns the engine requests to run: the request itself, or for ``n`` > 1 /
    ``best_of`` one child per candidate. ``process`` consumes one step's EngineCoreOutputs: it puts
    each RequestOutput in its request's queue, or returns it when the request has none, together
    with the engine ids to finish because a stop string ended them (the engine only knows
    token-level stops). A request leaves the registry when it finishes or is aborted.
    """

    def __init__(self) -> None:
        self._requests: dict[str, RequestState] = {}
        self._sequences: dict[str, tuple[RequestState, SequenceState]] = {}  # by engine-core request id
        self._num_sequences = 0  # engine requests of the registered requests (finished children included)

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        tokenizer: Any | None = None,
        arrival_time: float | None = None,
        queue: Any | None = None,
    ) -> list[tuple[str, SamplingParams]]:
        """Start tracking a request; return ``(engine request id, sampling params)`` to submit.

        Children of a parallel-sampling request get ids ``child_request_id(i, request_id)``, seeds
        ``seed + i``, prompt logprobs only on child 0, and logprobs=0 when ``best_of`` > ``n`` and
        the user asked for none, so their cumulative logprobs can be ranked at the end. ``bad_words``
        not yet tokenized are tokenized here (``bad_words_token_ids``), since the sampler has no tokenizer.
        ``queue`` (an asyncio.Queue) receives the request's RequestOutputs instead of ``process``'s result.
        """
        if request_id in self._requests:
            raise ValueError(f"Request id {request_id!r} is already running.")
        if tokenizer is None and sampling_params.detokenize and sampling_params.stop:
            raise ValueError("Stop strings need a tokenizer to detokenize the output.")
        if sampling_params.bad_words and sampling_params.bad_words_token_ids is None:
            if tokenizer is None:
                raise ValueError("bad_words need a tokenizer; pass bad_words_token_ids instead.")
            sampling_params = sampling_params.clone(
                bad_words_token_ids=bad_words_token_ids(tokenizer, sampling_params.bad_words)
            )
        request = RequestState(request_id, prompt, list(prompt_token_ids), sampling_params, tokenizer, arrival_time,
                               queue)
        candidates = sampling_params.num_candidates
        engine_requests = []
        for index in range(candidates):
            engine_id = request_id if candidates == 1 else child_request_id(index, request_id)
            params = sampling_params if candidates == 1 else _child_params(sampling_params, index)
            sequence = SequenceState(
                index, params, request.prompt_token_ids, tokenizer, sampling_params.logprobs is not None
            )
            request.sequences.append(sequence)
            request.engine_ids.append(engine_id)
            self._sequences[engine_id] = (request, sequence)
            engine_requests.append((engine_id, params))
        self._requests[request_id] = request
        self._num_sequences += len(request.engine_ids)
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


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    logprobs = params.logprobs
    if logprobs is None and params.num_candidates > params.n:
        logprobs = 0
    return params.clone(
        n=1,
        best_of=None,
        seed=None if params.seed is None else params.seed + index,
        logprobs=logprobs,
        prompt_logprobs=params.prompt_logprobs if index == 0 else None,
    )
