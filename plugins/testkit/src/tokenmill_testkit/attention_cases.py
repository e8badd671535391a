"""The layer shapes and batch mixes the attention suite runs, as plain data.

A ``BatchMix`` is a short engine run: a list of steps, each listing ``(request, new tokens)`` in
batch order. Lengths are written relative to the block size so every mix crosses block boundaries
whatever the block size is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tokenmill.plugin_api import AttentionSpec


@dataclass(frozen=True)
class AttentionCase:
    """One attention layer shape; ``spec(dtype)`` turns it into the layer's ``AttentionSpec``."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int = 16
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    kv_cache_dtype: str = "auto"
    scale: float | None = None  # default head_size ** -0.5

    @property
    def id(self) -> str:
        parts = [f"h{self.num_heads}kv{self.num_kv_heads}d{self.head_size}b{self.block_size}"]
        if self.sliding_window is not None:
            parts.append(f"sw{self.sliding_window}")
        if self.logits_soft_cap is not None:
            parts.append(f"cap{self.logits_soft_cap:g}")
        if self.kv_cache_dtype != "auto":
            parts.append(f"kv{self.kv_cache_dtype}")
        if self.scale is not None:
            parts.append(f"scale{self.scale:g}")
        return "-".join(parts)

    def spec(self, dtype: str) -> AttentionSpec:
        return AttentionSpec(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            scale=self.head_size**-0.5 if self.scale is None else self.scale,
            dtype=dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            block_size=self.block_size,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
        )


DEFAULT_CASES = (
    AttentionCase(4, 4, 64),  # multi-head
    AttentionCase(8, 2, 64),  # grouped-query
    AttentionCase(8, 1, 128),  # multi-query
    AttentionCase(4, 2, 64, block_size=32),
    AttentionCase(4, 2, 80),  # a head size that is not a power of two
    AttentionCase(4, 2, 256),
    AttentionCase(4, 2, 64, sliding_window=8),
    AttentionCase(4, 2, 64, logits_soft_cap=2.0),  # small cap, so ignoring it is visible
    AttentionCase(4, 2, 64, sliding_window=8, logits_soft_cap=2.0),
    AttentionCase(4, 2, 64, scale=0.3),  # not 1/sqrt(head_size), as with Gemma's query_pre_attn_scalar
    AttentionCase(4, 2, 64, kv_cache_dtype="fp8"),
)


@dataclass(frozen=True)
class BatchMix:
    """Steps of ``(request, new tokens)``; ``shared_blocks`` maps a request to (owner, n): its
    first ``n`` blocks are the owner's (a prefix-cache hit), already written before it starts."""

    name: str
    steps: tuple[tuple[tuple[int, int], ...], ...]
    shared_blocks: tuple[tuple[int, int, int], ...] = ()  # (request, owner, blocks)


def _prefill(bs: int) -> BatchMix:
    return BatchMix("prefill", (((0, 7), (1, 2 * bs + 3), (2, 1)),))


def _decode(bs: int) -> BatchMix:
    # Request 0 ends its first block on the first decode and opens a new block on the second.
    prompt = ((0, bs - 1), (1, 5), (2, 2 * bs + 8))
    decode = ((0, 1), (1, 1), (2, 1))
    return BatchMix("decode", (prompt, decode, decode))


def _mixed(bs: int) -> BatchMix:
    # Step 2: a chunked-prefill continuation, a decode and a new prompt, interleaved.
    return BatchMix("mixed", (((0, 9), (1, bs + 4)), ((1, 6), (0, 1), (2, 11))))


def _prefix_hit(bs: int) -> BatchMix:
    # Request 1 reuses request 0's first two blocks, then prefills 7 tokens of its own.
    return BatchMix("prefix_hit", (((0, 2 * bs + 5),), ((1, 7), (0, 1))), shared_blocks=((1, 0, 2),))


DEFAULT_MIXES: dict[str, Callable[[int], BatchMix]] = {
    "prefill": _prefill,
    "decode": _decode,
    "mixed": _mixed,
    "prefix_hit": _prefix_hit,
}
