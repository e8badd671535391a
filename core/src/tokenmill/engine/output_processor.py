"""OutputProcessor: engine-core outputs -> RequestOutputs, in the front end (no model).

It detokenizes incrementally, matches stop strings across token boundaries, turns logprobs entries
into per-position dicts with token texts, and folds the n (or best_of) child sequences of a
parallel-sampling request into one RequestOutput.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from tokenmill.engine.messages import EngineCoreOutput, LogprobsEntry
from tokenmill.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestMetrics, RequestOutput, SampleLogprobs
from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.tokenizer.bad_words import bad_words_token_ids
from tokenmill.tokenizer.detokenizer import IncrementalDetokenizer, token_texts
from tokenmill.tokenizer.stop_strings import find_stop_string, stop_holdback


def child_request_id(index: int, parent_id: str) -> str:
    """The engine-core id of the ``index``-th sequence of a request sampled more than once."""
    return f"{index}_{parent_id}"


class OutputProcessor:
    """Tracks every unfinished request between the engine core and the user.

    ``add_request`` returns the engine requests to run: the request itself, or for ``n`` > 1 /
    ``best_of`` one child per candidate. ``process`` consumes one step's EngineCoreOutputs and
    returns the RequestOutputs to hand out plus the engine ids to abort because a stop string ended
    them (the engine only knows token-level stops).
    """

    def __init__(self) -> None:
        self._requests: dict[str, _Request] = {}
        self._sequences: dict[str, tuple[_Request, _Sequence]] = {}  # by engine-core request id

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        tokenizer: Any | None = None,
        arrival_time: float | None = None,
    ) -> list[tuple[str, SamplingParams]]:
        """Start tracking a request; return ``(engine request id, sampling params)`` to submit.

        Children of a parallel-sampling request get ids ``child_request_id(i, request_id)``, seeds
        ``seed + i``, prompt logprobs only on child 0, and logprobs=0 when ``best_of`` > ``n`` and
        the user asked for none, so their cumulative logprobs can be ranked at the end. ``bad_words``
        not yet tokenized are tokenized here (``bad_words_token_ids``), since the sampler has no tokenizer.
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
        request = _Request(request_id, prompt, list(prompt_token_ids), sampling_params, tokenizer, arrival_time)
        candidates = sampling_params.num_candidates
        engine_requests = []
        for index in range(candidates):
            engine_id = request_id if candidates == 1 else child_request_id(index, request_id)
            params = sampling_params if candidates == 1 else _child_params(sampling_params, index)
            sequence = _Sequence(
                index, params, request.prompt_token_ids, tokenizer, sampling_params.logprobs is not None
            )
            request.sequences.append(sequence)
            request.engine_ids.append(engine_id)
            self._sequences[engine_id] = (request, sequence)
            engine_requests.append((engine_id, params))
        self._requests[request_id] = request
        return engine_requests

    def process(
        self, engine_outputs: Iterable[EngineCoreOutput], now: float | None = None
    ) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs; return (RequestOutputs, engine ids to abort)."""
        now = time.time() if now is None else now
        touched: dict[str, list[_Sequence]] = {}
        to_abort: list[str] = []
        for output in engine_outputs:
            entry = self._sequences.get(output.request_id)
            if entry is None:
                continue  # aborted, or finished by a stop string while this step was in flight
            request, sequence = entry
            request.record(output, now)
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
                del self._requests[request_id]
            request_output = request.make_output(sequences)
            if request_output is not None:
                request_outputs.append(request_output)
        return request_outputs, to_abort

    def abort(self, request_ids: Iterable[str]) -> list[str]:
        """Stop tracking user requests; return the engine ids the engine core must abort."""
        engine_ids = []
        for request_id in request_ids:
            request = self._requests.pop(request_id, None)
            if request is None:
                continue
            for engine_id in request.engine_ids:
                if self._sequences.pop(engine_id, None) is not None:
                    engine_ids.append(engine_id)
        return engine_ids

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

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


def _logprob_dicts(entries: Sequence[LogprobsEntry | None], tokenizer: Any | None) -> list[dict[int, Logprob] | None]:
    ids = [t for e in entries if e is not None for t in e.token_ids]
    texts = iter(token_texts(tokenizer, ids) if tokenizer is not None else [None] * len(ids))
    result: list[dict[int, Logprob] | None] = []
    for entry in entries:
        if entry is None:
            result.append(None)
            continue
        position: dict[int, Logprob] = {}
        for token_id, logprob, rank in zip(entry.token_ids, entry.logprobs, entry.ranks, strict=True):
            text = next(texts)
            position.setdefault(token_id, Logprob(logprob, rank, text))  # the sampled token keeps its own rank
        result.append(position)
    return result


class _Sequence:
    """Text, tokens and logprobs of one engine request (one completion)."""

    def __init__(
        self,
        index: int,
        params: SamplingParams,
        prompt_token_ids: list[int],
        tokenizer: Any | None,
        keep_logprobs: bool,
    ) -> None:
        self.index = index
        self.params = params
        self.tokenizer = tokenizer
        self.detokenizer = None
        if tokenizer is not None and params.detokenize:
            self.detokenizer = IncrementalDetokenizer(
                tokenizer,
                prompt_token_ids,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: SampleLogprobs | None = [] if keep_logprobs else None
        self.cumulative_logprob: float | None = None if params.logprobs is None else 0.0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._holdback = stop_holdback(params.stop, params.include_stop_str_in_output)
        self._searched_chars = 0  # text before this offset holds no stop string (or is within min_tokens)
        self._sent_chars = self._sent_tokens = self._sent_logprobs = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, output: EngineCoreOutput) -> str | None:
        """Apply one step's output; return the stop string that ended the sequence, if one did."""
        new_ids = list(output.new_token_ids)
        if output.new_logprobs:
            self.cumulative_logprob = (self.cumulative_logprob or 0.0) + sum(e.logprobs[0] for e in output.new_logprobs)
            if self.logprobs is not None:
                self.logprobs += _logprob_dicts(output.new_logprobs, self.tokenizer)
        self.token_ids += new_ids
        stop_string = self._detokenize(new_ids, output) if self.detokenizer is not None else None
        if stop_string is not None:
            self.finish_reason, self.stop_reason = "stop", stop_string
        elif output.finished:
            self.finish_reason, self.stop_reason = output.finish_reason, output.stop_reason
        return stop_string

    def _detokenize(self, new_ids: list[int], output: EngineCoreOutput) -> str | None:
        params = self.params
        text_ids = new_ids
        token_stopped = output.finish_reason == "stop" and not isinstance(output.stop_reason, str)
        if token_stopped and new_ids and not params.include_stop_str_in_output:
            text_ids = new_ids[:-1]  # the EOS / stop token's own text stays out, like vLLM
        num_before = len(self.token_ids) - len(new_ids)
        for offset, token_id in enumerate(text_ids):
            self.text += self.detokenizer.push(token_id)
            if num_before + offset + 1 <= params.min_tokens:
                self._searched_chars = len(self.text)
        if output.finished:
            self.text += self.detokenizer.flush()
        if not params.stop or len(self.token_ids) <= params.min_tokens:
            return None
        match = find_stop_string(
            self.text, len(self.text) - self._searched_chars, params.stop, params.include_stop_str_in_output
        )
        self._searched_chars = len(self.text)
        if match is None:
            return None
        stop_string, cut = match
        self.text = self.text[:cut]
        return stop_string

    def completion(self, kind: RequestOutputKind) -> CompletionOutput:
        """This sequence as a CompletionOutput: all of it, or (DELTA) what was not sent yet.
        While unfinished, the last characters that could start a stop string are held back."""
        visible = len(self.text) if self.finished else max(len(self.text) - self._holdback, self._sent_chars)
        if kind == RequestOutputKind.DELTA:
            text = self.text[self._sent_chars : visible]
            token_ids = self.token_ids[self._sent_tokens :]
            logprobs = None if self.logprobs is None else self.logprobs[self._sent_logprobs :]
            self._sent_chars, self._sent_tokens = visible, len(self.token_ids)
            self._sent_logprobs = 0 if self.logprobs is None else len(self.logprobs)
        else:
            text, token_ids = self.text[:visible], list(self.token_ids)
            logprobs = None if self.logprobs is None else list(self.logprobs)
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=self.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )


class _Request:
    """A user request: its prompt, its sequences and its metrics."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Any | None,
        arrival_time: float | None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.tokenizer = tokenizer
        self.sequences: list[_Sequence] = []
        self.engine_ids: list[str] = []
        self.prompt_logprobs: PromptLogprobs | None = None if params.prompt_logprobs is None else []
        self._sent_prompt_logprobs = 0
        self.metrics = RequestMetrics(arrival_time=time.time() if arrival_time is None else arrival_time)
        self.selects_best = params.num_candidates > params.n
        # the best n are known only at the end, so best_of requests report once, when finished
        self.kind = RequestOutputKind.FINAL_ONLY if self.selects_best else params.output_kind

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.sequences)

    def record(self, output: EngineCoreOutput, now: float) -> None:
        """Update metrics and prompt logprobs from one engine output."""
        if output.new_token_ids:
            if self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
            self.metrics.last_token_time = now
            self.metrics.num_generation_tokens += len(output.new_token_ids)
        self.metrics.num_cached_tokens = max(self.metrics.num_cached_tokens, output.num_cached_tokens)
        if output.prompt_logprobs and self.prompt_logprobs is not None:
            self.prompt_logprobs += _logprob_dicts(output.prompt_logprobs, self.tokenizer)

    def make_output(self, touched: list[_Sequence]) -> RequestOutput | None:
        """The RequestOutput for a step in which ``touched`` got tokens or finished (None: nothing
        to report yet)."""
        finished = self.finished
        if self.kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if self.kind == RequestOutputKind.DELTA:
            sequences = sorted(set(touched), key=lambda s: s.index)
        else:
            sequences = self.sequences
        completions = [s.completion(self.kind) for s in sequences]
        if finished and self.selects_best:
            completions.sort(
                key=lambda c: float("-inf") if c.cumulative_logprob is None else c.cumulative_logprob, reverse=True
            )
            completions = completions[: self.params.n]
            for index, completion in enumerate(completions):
                completion.index = index
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self._prompt_logprobs_to_send(),
            outputs=completions,
            finished=finished,
            metrics=self.metrics,
            num_cached_tokens=self.metrics.num_cached_tokens,
        )

    def _prompt_logprobs_to_send(self) -> PromptLogprobs | None:
        if self.prompt_logprobs is None:
            return None
        if self.kind != RequestOutputKind.DELTA:
            return list(self.prompt_logprobs)
        new = self.prompt_logprobs[self._sent_prompt_logprobs :]
        self._sent_prompt_logprobs = len(self.prompt_logprobs)
        return new or None
