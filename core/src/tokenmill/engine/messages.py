"""Messages between the front end (tokenizer, detokenizer, API) and the engine core.

They are msgspec structs so they cross a ZMQ socket as msgpack, never pickle; in-process they are
passed as they are.
"""

from __future__ import annotations

import msgspec

from tokenmill.sampling_params import SamplingParams


class LogprobsEntry(msgspec.Struct, array_like=True, omit_defaults=True):
    """Log-probabilities at one position: the chosen token first, then the top-k, best first.

    ``ranks[i]`` is the 1-based rank of ``token_ids[i]`` in the full distribution.
    """

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


class EngineCoreRequest(msgspec.Struct, omit_defaults=True):
    """A tokenized request for the engine core."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int] = []
    arrival_time: float = 0.0
    priority: int = 0
    cache_salt: str | None = None
    fork_of: str | None = None  # a sibling (n > 1) whose full prompt blocks this request may share


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one step produced for one request: new tokens and, at the end, why it finished.

    ``finish_reason`` is "stop", "length" or "abort"; ``stop_reason`` is the stop token id when a
    stop token (not EOS) ended it. ``num_cached_tokens`` is the prompt's prefix-cache hit length.
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[LogprobsEntry] | None = None
    prompt_logprobs: list[LogprobsEntry | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step's outputs, with the scheduler's counters for logging and metrics."""

    outputs: list[EngineCoreOutput]
    timestamp: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec_num_drafts: int = 0  # speculative decoding totals since start
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
