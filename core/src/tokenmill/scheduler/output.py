"""SchedulerOutput: the only message from the scheduler to the model runner, once per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenmill.request import Request


@dataclass
class ScheduledRequest:
    """One request's share of a step.

    The runner feeds ``token_ids`` at positions ``start_position ...`` and writes their K/V into the
    slots of ``block_ids`` (the request's whole block table). When ``sample`` is true this chunk
    reaches the end of the known tokens, so the runner samples the next token from the logits of
    the last fed token. The last ``num_spec_tokens`` of ``token_ids`` are draft tokens (speculative
    decoding) to verify: the runner returns the target's tokens up to the first that differs from
    them, plus one.
    """

    request: Request
    token_ids: list[int]
    start_position: int
    block_ids: list[int]
    sample: bool
    num_spec_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    """The step: which requests run, with how many tokens each, in batch order."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_request_ids: set[str] = field(default_factory=set)
    finished_request_ids: set[str] = field(default_factory=set)  # freed since the previous step

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.request_id: s.num_tokens for s in self.scheduled}

    @property
    def total_num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
