"""RequestState: one user request in the front end's registry — its prompt, its sequences, its
metrics and where its RequestOutputs go."""

from __future__ import annotations

import time
from typing import Any

from tokenmill.frontend.parallel_sampling import best_completions
from tokenmill.frontend.sequence_state import SequenceState, logprob_dicts
from tokenmill.frontend.stats import FinishedRequestStats, IterationStats
from tokenmill.outputs import PromptLogprobs, RequestMetrics, RequestOutput
from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.wire import EngineCoreOutput


class RequestState:
    """A user request: its prompt, its sequences (one per engine request), its metrics, and its
    ``queue``: where the async front end takes its RequestOutputs from (None: ``process`` returns them)."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Any | None,
        arrival_time: float | None,
        queue: Any | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.tokenizer = tokenizer
        self.queue = queue  # an asyncio.Queue of RequestOutputs and exceptions, or None
        self.sequences: list[SequenceState] = []
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

    def record(self, output: EngineCoreOutput, now: float, stats: IterationStats | None = None,
               first_in_step: bool = True) -> None:
        """Update metrics and prompt logprobs from one engine output (and count it in ``stats``;
        ``first_in_step``: no other output of this request was recorded in this step)."""
        if output.new_token_ids:
            if stats is not None:
                stats.record_tokens(self.metrics, len(self.prompt_token_ids), len(output.new_token_ids), now,
                                    first_in_step)
            if self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
            self.metrics.last_token_time = now
            self.metrics.num_generation_tokens += len(output.new_token_ids)
        self.metrics.num_cached_tokens = max(self.metrics.num_cached_tokens, output.num_cached_tokens)
        if output.prompt_logprobs and self.prompt_logprobs is not None:
            self.prompt_logprobs += logprob_dicts(output.prompt_logprobs, self.tokenizer)

    def finished_stats(self, finish_reason: str, now: float) -> FinishedRequestStats:
        """This request's line in the metrics once it ended with ``finish_reason`` at ``now``."""
        return FinishedRequestStats(finish_reason, now - self.metrics.arrival_time, len(self.prompt_token_ids),
                                    self.metrics.num_generation_tokens)

    def make_output(self, touched: list[SequenceState]) -> RequestOutput | None:
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
            completions = best_completions(completions, self.params.n)
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
