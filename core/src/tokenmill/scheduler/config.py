"""SchedulerConfig: the scheduler's slice of the resolved engine configuration."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one step and of the KV cache. Validated on construction.

    ``num_blocks`` counts every block of the KV cache, including the reserved null block 0.
    ``policy`` "priority" serves lower ``priority`` values first, then earlier arrivals.
    ``long_prefill_token_threshold`` (0 = off, needs chunked prefill) caps the prefill tokens one
    request gets per step, so long prompts do not crowd out the others. ``num_lookahead_tokens``
    (speculative decoding) reserves that many slots past each sampling chunk, where draft tokens
    are written before the next step verifies them.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    block_size: int = 16
    num_blocks: int = 1024
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    num_lookahead_tokens: int = 0

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(self.max_num_seqs >= 1, f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        check(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}",
        )
        check(self.max_model_len >= 1, f"max_model_len must be at least 1, got {self.max_model_len}")
        check(self.block_size >= 1, f"block_size must be at least 1, got {self.block_size}")
        check(self.num_blocks >= 2, f"num_blocks must be at least 2 (block 0 is reserved), got {self.num_blocks}")
        check(self.policy in SCHEDULING_POLICIES, f"policy must be one of {SCHEDULING_POLICIES}, got {self.policy!r}")
        check(
            self.long_prefill_token_threshold >= 0,
            f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}",
        )
        check(self.num_lookahead_tokens >= 0, f"num_lookahead_tokens must be >= 0, got {self.num_lookahead_tokens}")
        check(
            self.long_prefill_token_threshold == 0 or self.enable_chunked_prefill,
            "long_prefill_token_threshold splits prompts, so it needs enable_chunked_prefill=True",
        )
