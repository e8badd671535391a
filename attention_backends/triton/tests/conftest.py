"""Shared setup for the Triton backend tests: interpreter mode on machines without a GPU, and
``PagedCase``, a random paged-attention step with a dense per-request oracle.

Triton reads TRITON_INTERPRET when ``@triton.jit`` decorates a kernel, i.e. when
``tokenmill_attn_triton.unified_attention`` / ``.kv_cache_write`` are first imported; this module is
loaded before any test module, so setting the variable here takes effect (test_attn_triton_backend
checks that the kernels really are interpreted). On a CUDA machine the variable is left alone and
the same tests run compiled kernels on the GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from tokenmill.plugin_api import AttentionBatch, AttentionSpec  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
DEVICE = "cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda"
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
CACHE_DTYPES = {
    "auto": None,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def index_copy(dst: torch.Tensor, slots: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.index_copy_(0, slots, src)`` after converting ``src`` to ``dst``'s dtype; fp8 saturates
    at its largest finite value and goes through a uint8 view (torch has no fp8 index_copy)."""
    if dst.element_size() == 1:
        bound = torch.finfo(dst.dtype).max
        src = src.float().clamp(-bound, bound).to(dst.dtype)
        dst, src = dst.view(torch.uint8), src.view(torch.uint8)
    src = src.to(dst.dtype)
    dst.index_copy_(0, slots, src)


def dense_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    spec: AttentionSpec,
) -> torch.Tensor:
    """Textbook attention in fp32 for one request: ``query`` [q, H, D] are the last q positions of
    ``keys``/``values`` [s, Hkv, D]."""
    num_queries, seq_len = query.shape[0], keys.shape[0]
    group = spec.num_heads // spec.num_kv_heads
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), k) * spec.scale
    if spec.logits_soft_cap is not None:
        scores = spec.logits_soft_cap * torch.tanh(scores / spec.logits_soft_cap)
    query_pos = torch.arange(seq_len - num_queries, seq_len, device=query.device)[:, None]
    key_pos = torch.arange(seq_len, device=query.device)[None, :]
    visible = torch.ones(num_queries, seq_len, dtype=torch.bool, device=query.device)
    if spec.causal:
        visible &= key_pos <= query_pos
    if spec.sliding_window is not None:
        visible &= query_pos - key_pos < spec.sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@dataclass
class PagedCase:
    """One step: request ``i`` has ``context_lens[i]`` tokens already in a shuffled paged cache and
    ``query_lens[i]`` new tokens; ``padding`` extra rows (slot -1) trail the real tokens."""

    spec: AttentionSpec
    batch: AttentionBatch
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    kv_cache: torch.Tensor
    full_keys: list[torch.Tensor]
    full_values: list[torch.Tensor]

    def expected(self) -> torch.Tensor:
        """The dense oracle for every real token, in fp32, from K/V rounded to the cache dtype."""
        cache_dtype = self.kv_cache.dtype
        starts = self.batch.query_start_loc.tolist()
        outputs = [
            dense_attention(
                self.query[starts[i] : starts[i + 1]],
                self.full_keys[i].to(cache_dtype),
                self.full_values[i].to(cache_dtype),
                self.spec,
            )
            for i in range(self.batch.num_requests)
        ]
        return torch.cat(outputs)

    def expected_cache(self) -> torch.Tensor:
        """The cache after the step's write, built with index_copy_."""
        cache = self.kv_cache.clone()
        flat = cache.view(2, -1, self.spec.num_kv_heads, self.spec.head_size)
        real = self.batch.slot_mapping[: self.batch.num_tokens]
        index_copy(flat[0], real, self.key[: self.batch.num_tokens])
        index_copy(flat[1], real, self.value[: self.batch.num_tokens])
        return cache


def make_case(
    query_lens: list[int],
    context_lens: list[int] | None = None,
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_size: int = 32,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    kv_cache_dtype: str = "auto",
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    causal: bool = True,
    padding: int = 0,
    spare_blocks: int = 3,
    device: str = DEVICE,
    seed: int = 0,
    fp8_exact: bool = INTERPRETED,
) -> PagedCase:
    """Build a random ``PagedCase`` (see its docstring) on ``device``.

    With ``fp8_exact`` and an fp8 cache, keys and values are drawn already representable in the
    cache dtype: the interpreter's float-to-fp8 rounding drops the carry into the exponent
    (1.97 becomes 1.0, not 2.0), so only exact values can be compared with torch's conversion there.
    """
    generator = torch.Generator().manual_seed(seed)
    context_lens = context_lens or [0] * len(query_lens)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    blocks_per_request = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_request) + spare_blocks
    physical = torch.randperm(num_blocks, generator=generator)
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_request, default=1), dtype=torch.int32)
    taken = 0
    for i, n in enumerate(blocks_per_request):
        block_tables[i, :n] = physical[taken : taken + n]
        taken += n

    spec = AttentionSpec(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        scale=head_size**-0.5,
        dtype=str(dtype).removeprefix("torch."),
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        causal=causal,
    )
    cache_dtype = CACHE_DTYPES[kv_cache_dtype] or dtype
    kv_cache = torch.zeros(2, num_blocks, block_size, num_kv_heads, head_size, dtype=cache_dtype)
    flat_cache = kv_cache.view(2, -1, num_kv_heads, head_size)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    def randn_kv(*shape: int) -> torch.Tensor:
        return randn(*shape).to(cache_dtype).to(dtype) if fp8_exact else randn(*shape)

    full_keys = [randn_kv(s, num_kv_heads, head_size) for s in seq_lens]
    full_values = [randn_kv(s, num_kv_heads, head_size) for s in seq_lens]
    new_slots = []
    for i, (context_len, seq_len) in enumerate(zip(context_lens, seq_lens, strict=True)):
        positions = torch.arange(seq_len)
        slots = block_tables[i, positions // block_size].long() * block_size + positions % block_size
        index_copy(flat_cache[0], slots[:context_len], full_keys[i][:context_len])
        index_copy(flat_cache[1], slots[:context_len], full_values[i][:context_len])
        new_slots.append(slots[context_len:])

    num_tokens = sum(query_lens)
    pad_slots = torch.full((padding,), -1, dtype=torch.int64)
    slot_mapping = torch.cat([*new_slots, pad_slots])
    key = torch.cat(
        [*(k[c:] for k, c in zip(full_keys, context_lens, strict=True)), randn_kv(padding, num_kv_heads, head_size)]
    )
    value = torch.cat(
        [*(v[c:] for v, c in zip(full_values, context_lens, strict=True)), randn_kv(padding, num_kv_heads, head_size)]
    )
    query = randn(num_tokens + padding, num_heads, head_size)
    batch = AttentionBatch.build(query_lens, context_lens, block_tables, block_size, slot_mapping=slot_mapping,
                                 device=device)
    return PagedCase(
        spec=spec,
        batch=batch,
        query=query.to(device),
        key=key.to(device),
        value=value.to(device),
        kv_cache=kv_cache.to(device),
        full_keys=[k.to(device) for k in full_keys],
        full_values=[v.to(device) for v in full_values],
    )


@pytest.fixture
def paged_case():
    """The ``make_case`` factory."""
    return make_case


def run_triton(case: PagedCase) -> torch.Tensor:
    """Plan and run one step of the Triton backend on ``case`` (its cache is written in place)."""
    from tokenmill_attn_triton import TritonAttentionBackend

    backend = TritonAttentionBackend(device=case.query.device)
    metadata = backend.plan(case.batch)
    return backend.forward(case.spec, case.query, case.key, case.value, case.kv_cache, metadata)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Elementwise closeness with the tolerance of the compute ``dtype``."""
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), atol=tol, rtol=tol)


@pytest.fixture
def triton_step():
    """``run_triton``: plan + forward of the backend on a ``PagedCase``."""
    return run_triton


@pytest.fixture
def close():
    """``assert_close`` with per-dtype tolerances."""
    return assert_close


@pytest.fixture
def device() -> str:
    """Where the tests' tensors live: "cpu" under the interpreter, else "cuda"."""
    return DEVICE


@pytest.fixture
def interpreted() -> bool:
    """Whether the kernels run under the Triton interpreter in this session."""
    return INTERPRETED
