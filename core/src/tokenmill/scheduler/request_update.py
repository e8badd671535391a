"""RequestUpdate: what one step did to one request, as the scheduler reports it to the engine."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.request import Request


@dataclass
class RequestUpdate:
    """The tokens a request gained this step and whether it finished (``request.finish_reason`` says why)."""

    request: Request
    new_token_ids: list[int]
    finished: bool

    @property
    def request_id(self) -> str:
        return self.request.request_id
