"""ReferenceAttentionBackend: paged attention in plain PyTorch, on any torch device.

It is the correctness oracle for every other backend (the testkit compares against it), the path of
last resort, and a base class for backends that replace some of its steps with their own kernels
(its plan, ``AttentionGroup`` and ``ReferenceAttentionMetadata`` are part of the plugin contract),
so it avoids per-request Python loops in the layers. ``plan`` splits the step
into at most two groups, the decodes (one query each) and the prefill chunks, and precomputes for
each group the cache blocks to read ([requests, blocks]) and where its tokens sit in a padded
[requests, max_query_len] query block. ``forward`` then gathers K/V blocks from the cache (a
prefill with nothing cached uses its own K/V directly) and runs one batched
``scaled_dot_product_attention`` per group; masks (causal with each request's offset, sequence
length, sliding window) are built once per step and window size.
Logits soft-capping takes an explicit matmul / tanh / softmax path.

An fp8 cache stores keys and values cast to float8 with a scale of 1.0 (clamped to its range).
Masked keys are read too (whole blocks are copied), so cache memory must never hold NaN or inf:
allocate caches with ``torch.zeros``, not ``torch.empty``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from tokenmill.plugin_api import AttentionBackend, AttentionBatch, AttentionCapabilities, AttentionSpec

_HAS_ENABLE_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass
class AttentionGroup:
    """Requests of one step attended together; every tensor lives on the compute device.

    ``token_index`` [n] lists the group's query tokens in the flat batch (None: all of them, in
    order); ``pad_index`` [n] places them in the padded [requests * max_query_len] block (None:
    no padding needed).
    """

    num_requests: int
    max_query_len: int
    max_seq_len: int
    token_index: torch.Tensor | None
    pad_index: torch.Tensor | None
    block_index: torch.Tensor  # int64 [requests, ceil(max_seq_len / block_size)]: the blocks to read
    query_positions: torch.Tensor  # int64 [requests, max_query_len]; padding rows repeat the last
    fresh: bool  # prefill with nothing cached before this step: its own keys are all the keys
    plain_causal: bool  # fresh and equal lengths: the top-left causal mask is exact
    uniform_lengths: bool  # decode group whose requests all have max_seq_len keys
    _masks: dict[tuple[int | None, bool], torch.Tensor | None] = field(default_factory=dict)

    def mask(self, window: int | None, explicit: bool = False) -> torch.Tensor | None:
        """Boolean [requests, 1, max_query_len, max_seq_len], True where a query may attend; None
        when no mask is needed (``explicit`` forces one, for the soft-cap path)."""
        key = (window, explicit)
        if key not in self._masks:
            self._masks[key] = self._build_mask(window, explicit)
        return self._masks[key]

    def _build_mask(self, window: int | None, explicit: bool) -> torch.Tensor | None:
        if window is None and not explicit and (self.plain_causal or self.uniform_lengths):
            return None
        keys = torch.arange(self.max_seq_len, device=self.block_index.device)
        queries = self.query_positions[:, :, None]
        allowed = keys <= queries
        if window is not None:
            allowed &= keys > queries - window
        return allowed[:, None]


@dataclass
class ReferenceAttentionMetadata:
    """The planned step: the slot of every new token and the groups to attend."""

    slot_mapping: torch.Tensor
    num_tokens: int
    groups: list[AttentionGroup]


def _plan_group(batch: AttentionBatch, requests: list[int], token_starts: list[int], all_requests: bool,
                device: torch.device) -> AttentionGroup:
    query_lens = [batch.query_lens_cpu[i] for i in requests]
    seq_lens = [batch.seq_lens_cpu[i] for i in requests]
    max_q, max_s = max(query_lens), max(seq_lens)
    context_lens = [s - q for s, q in zip(seq_lens, query_lens, strict=True)]
    fresh = max_q > 1 and not any(context_lens)

    token_index = pad_index = None
    if not all_requests:
        token_index = torch.cat([torch.arange(token_starts[i], token_starts[i] + batch.query_lens_cpu[i])
                                 for i in requests]).to(device)
    if any(q != max_q for q in query_lens):
        pad_index = torch.cat([torch.arange(q) + row * max_q for row, q in enumerate(query_lens)]).to(device)

    rows = torch.tensor(requests, device=device) if not all_requests else slice(None)
    num_blocks = -(-max_s // batch.block_size)
    block_index = batch.block_tables[rows, :num_blocks].to(torch.int64).contiguous()
    lens = torch.tensor(seq_lens, dtype=torch.int64)

    starts = torch.tensor(context_lens, dtype=torch.int64)
    query_positions = torch.minimum(starts[:, None] + torch.arange(max_q), lens[:, None] - 1)
    return AttentionGroup(
        num_requests=len(requests), max_query_len=max_q, max_seq_len=max_s, token_index=token_index,
        pad_index=pad_index, block_index=block_index, query_positions=query_positions.to(device),
        fresh=fresh, plain_causal=fresh and all(q == max_q for q in query_lens),
        uniform_lengths=max_q == 1 and all(s == max_s for s in seq_lens),
    )


def _gather(blocks: torch.Tensor, group: AttentionGroup, spec: AttentionSpec, dtype: torch.dtype) -> torch.Tensor:
    """Whole blocks [num_blocks, block_size * kv_heads * head] of one cache half ->
    [requests, kv_heads, max_seq_len, head] in ``dtype`` (copying blocks, not slots, is faster)."""
    picked = blocks.index_select(0, group.block_index.view(-1))
    picked = picked.view(group.num_requests, -1, spec.num_kv_heads, spec.head_size)
    return picked[:, : group.max_seq_len].to(dtype).transpose(1, 2)


def _pad(x: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """The group's tokens [n, heads, D] -> [requests, heads, max_query_len, D], zero-padded."""
    if group.pad_index is not None:
        padded = x.new_zeros(group.num_requests * group.max_query_len, *x.shape[1:])
        padded[group.pad_index] = x
        x = padded
    return x.reshape(group.num_requests, group.max_query_len, *x.shape[1:]).transpose(1, 2)


def _softcap_attention(q, k, v, mask, spec: AttentionSpec) -> torch.Tensor:
    """Explicit attention with ``cap * tanh(s / cap)`` logits; GQA by grouping query heads."""
    b, h, lq, d = q.shape
    kvh = k.shape[1]
    q = q.reshape(b, kvh, h // kvh, lq, d)
    scores = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)).float() * spec.scale
    cap = spec.logits_soft_cap
    scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask[:, :, None], float("-inf"))
    probs = scores.softmax(dim=-1).to(v.dtype)
    return torch.matmul(probs, v.unsqueeze(2)).reshape(b, h, lq, d)


def _sdpa(q, k, v, mask, is_causal: bool, spec: AttentionSpec) -> torch.Tensor:
    """q [b, H, L, D], k/v [b, KVH, S, D]."""
    b, h, lq, d = q.shape
    kvh = k.shape[1]
    if h != kvh and lq == 1:
        # decode: fold the query heads of one kv head into the query axis; the mask broadcasts
        out = F.scaled_dot_product_attention(q.reshape(b, kvh, h // kvh, d), k, v, attn_mask=mask, scale=spec.scale)
        return out.reshape(b, h, 1, d)
    if h != kvh and not _HAS_ENABLE_GQA:
        k, v = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
    extra = {"enable_gqa": True} if h != kvh and _HAS_ENABLE_GQA else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=spec.scale, **extra)


class ReferenceAttentionBackend(AttentionBackend):
    """Plain-PyTorch paged attention: any torch device, any head or block size, sliding windows,
    soft-capping, fp32/fp16/bf16 compute and fp8 caches."""

    name = "reference"
    api_version = (2, 0)
    capabilities = AttentionCapabilities(
        device_types=("cpu", "cuda", "xpu", "mps"),
        dtypes=("float32", "float16", "bfloat16"),
        kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
        families=("torch",),
    )
    any_torch_device: ClassVar[bool] = True
    """Whether the backend runs wherever torch does (its plain-PyTorch path), whatever device the
    platform names; a subclass with kernels for some devices only sets it False and is then
    validated against its ``capabilities.device_types`` and ``families`` like any backend."""

    @classmethod
    def validate(cls, spec: AttentionSpec, device_type: str, families: tuple[str, ...] = ()) -> list[str]:
        """The default checks; with ``any_torch_device`` every platform counts as the ``torch`` family."""
        return super().validate(spec, device_type, (*families, "torch") if cls.any_torch_device else families)

    def plan(self, batch: AttentionBatch) -> ReferenceAttentionMetadata:
        """Split the step into a decode group and a prefill group and precompute their indices."""
        device = batch.slot_mapping.device
        token_starts = [0]
        for q in batch.query_lens_cpu:
            token_starts.append(token_starts[-1] + q)
        decodes = [i for i, q in enumerate(batch.query_lens_cpu) if q == 1]
        prefills = [i for i, q in enumerate(batch.query_lens_cpu) if q > 1]
        groups = [
            _plan_group(batch, requests, token_starts, all_requests=len(requests) == batch.num_requests, device=device)
            for requests in (decodes, prefills)
            if requests
        ]
        return ReferenceAttentionMetadata(slot_mapping=batch.slot_mapping, num_tokens=batch.num_tokens, groups=groups)

    def forward(self, spec: AttentionSpec, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: ReferenceAttentionMetadata) -> torch.Tensor:
        """Write ``key``/``value`` at the slot mapping, then attend every query token to its own
        request's keys up to its position. Returns [T, num_heads, head_size]."""
        self._write(kv_cache.view(2, -1, *kv_cache.shape[-2:]), key, value, metadata.slot_mapping)
        blocks = kv_cache.view(2, kv_cache.shape[1], -1)
        if len(metadata.groups) == 1 and metadata.groups[0].token_index is None:
            return self._attend(spec, query, key, value, blocks, metadata.groups[0])
        out = torch.empty_like(query)
        for group in metadata.groups:
            index = group.token_index
            out[index] = self._attend(spec, query[index], key[index], value[index], blocks, group)
        return out

    @staticmethod
    def _write(flat: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
        if flat.element_size() == 1 and flat.dtype.is_floating_point:
            bound = torch.finfo(flat.dtype).max
            for i, x in enumerate((key, value)):
                x = x.clamp(-bound, bound).to(flat.dtype)
                flat[i].view(torch.uint8).index_copy_(0, slots, x.view(torch.uint8))
            return
        flat[0].index_copy_(0, slots, key.to(flat.dtype))
        flat[1].index_copy_(0, slots, value.to(flat.dtype))

    def _attend(self, spec: AttentionSpec, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                blocks: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
        """The group's tokens in order, ``query`` [n, H, D] and this step's ``key``/``value``
        [n, KVH, D] -> [n, H, D]."""
        q = _pad(query, group)
        if group.fresh and blocks.dtype == query.dtype:
            k, v = _pad(key, group), _pad(value, group)
        else:
            k = _gather(blocks[0], group, spec, query.dtype)
            v = _gather(blocks[1], group, spec, query.dtype)
        if spec.logits_soft_cap:
            out = _softcap_attention(q, k, v, group.mask(spec.sliding_window, explicit=True), spec)
        else:
            mask = group.mask(spec.sliding_window)
            out = _sdpa(q, k, v, mask, is_causal=mask is None and group.plain_causal, spec=spec)
        out = out.transpose(1, 2).reshape(-1, *query.shape[1:])
        return out if group.pad_index is None else out[group.pad_index]
