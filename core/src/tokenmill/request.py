"""Request: one sequence's state inside the engine core, from arrival to finish."""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tokenmill.sampling_params import SamplingParams

if TYPE_CHECKING:
    from tokenmill.structured.request_grammar import RequestGrammar
    from tokenmill.wire import EngineCoreRequest


class RequestStatus(enum.IntEnum):
    """Where a request is in its life. Every status from FINISHED_STOPPED on is final."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason: "stop", "length", "abort", or None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """A prompt, the tokens generated for it so far, and the bookkeeping the scheduler needs.

    ``all_token_ids`` is the prompt followed by the output; the first ``num_computed_tokens`` of
    them have their K/V in the cache. After a preemption ``num_computed_tokens`` drops to 0 and the
    generated tokens are recomputed together with the prompt.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        sampling_params: SamplingParams,
        eos_token_ids: Iterable[int] = (),
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        pooling: object | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop_token_ids = frozenset(sampling_params.stop_token_ids)
        self.priority = priority
        self.cache_salt = cache_salt
        # a pooling request's PoolingConfig: its prompt is prefilled (in chunks, like any prompt) and its
        # hidden states pooled into one vector when the last chunk has run; it never decodes
        self.pooling = pooling

        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.block_hashes: list[bytes] = []  # of the full blocks of all_token_ids, filled lazily
        self.spec_token_ids: list[int] = []  # draft tokens proposed for the next step to verify

        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

        self.runner_state: object = None  # scratch slot owned by the model runner
        self.grammar: RequestGrammar | None = None  # the structured-output constraint, set by the engine core

    @classmethod
    def from_engine_core_request(cls, message: EngineCoreRequest) -> Request:
        """Build the engine-side request from the front end's message (arrival 0.0 means now)."""
        return cls(
            request_id=message.request_id,
            prompt_token_ids=message.prompt_token_ids,
            sampling_params=message.sampling_params,
            eos_token_ids=message.eos_token_ids,
            arrival_time=message.arrival_time or None,
            priority=message.priority,
            cache_salt=message.cache_salt,
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def max_tokens(self) -> int | None:
        return self.sampling_params.max_tokens

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """Prompt logprobs need logits for every prompt token, and pooling the hidden state of every prompt
        token, so no prompt token may come from the cache."""
        return self.sampling_params.prompt_logprobs is not None or self.pooling is not None

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    def append_output_token(self, token_id: int) -> bool:
        """Keep ``token_id``; False (and nothing kept) when the request's grammar refuses it, which happens
        only when the grammar allowed no token at all (a dead end of the vocabulary)."""
        if self.grammar is not None and not self.grammar.is_terminated and not self.grammar.accept(token_id):
            return False
        if self.first_token_time is None:
            self.first_token_time = time.time()
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        return True

    def check_stop(self, max_model_len: int) -> bool:
        """Apply the token-level stop rules to the newest token; on a stop, set the final status.

        EOS (unless ``ignore_eos``) and ``stop_token_ids`` end the request with "stop" once
        ``min_tokens`` outputs exist; ``max_tokens`` outputs or ``max_model_len`` tokens end it
        with "length". A stop token wins over a length limit reached by the same token.
        """
        params = self.sampling_params
        if self.num_output_tokens >= params.min_tokens:
            last = self.output_token_ids[-1]
            if last in self.eos_token_ids and not params.ignore_eos:
                self.finish(RequestStatus.FINISHED_STOPPED)
                return True
            if last in self.stop_token_ids:
                self.finish(RequestStatus.FINISHED_STOPPED, stop_reason=last)
                return True
        if self.grammar is not None and self.grammar.is_terminated:  # complete: only a stop token could follow
            self.finish(RequestStatus.FINISHED_STOPPED)
            return True
        max_tokens = params.max_tokens
        if self.num_tokens >= max_model_len or (max_tokens is not None and self.num_output_tokens >= max_tokens):
            self.finish(RequestStatus.FINISHED_LENGTH)
            return True
        return False

    def finish(self, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        assert status.is_finished, status
        self.status = status
        self.stop_reason = stop_reason
        self.finished_time = time.time()

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_prompt_tokens}"
            f"+{self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
