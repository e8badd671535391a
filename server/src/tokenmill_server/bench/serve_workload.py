"""ServeWorkload: the load a serving comparison sends to every server — how many requests, their
prompt and output lengths, how many in flight — the same for each server and either load client."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ServeWorkload:
    """Random-token prompts of exactly ``input_len`` tokens, ``output_len`` greedy tokens each (ignore_eos)."""

    num_prompts: int = 64
    input_len: int = 128
    output_len: int = 128
    max_concurrency: int | None = 64
    request_rate: float = float("inf")
    seed: int = 0

    def describe(self) -> dict[str, Any]:
        """JSON-ready fields (an infinite rate as ``"inf"``), plus what every request sets."""
        fields = asdict(self)
        fields["request_rate"] = "inf" if self.request_rate == float("inf") else self.request_rate
        fields.update(dataset="random", ignore_eos=True, temperature=0.0, endpoint="/v1/completions", stream=True)
        return fields
