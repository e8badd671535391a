"""CpuAttentionBackend: the reference paged attention with float32 and bfloat16 steps computed by native kernels.

Decode rows (one query per request) attend in place over the cache blocks through
``kernels/paged_decode.c`` — no per-layer gather of keys and values, one call per layer for all
requests. Prefill chunks take ``kernels/paged_prefill.c`` once their keys and values are written:
tiles of each request's own tokens against its cache blocks, where the reference path pads every
request to the longest and masks (that padded ``scaled_dot_product_attention`` took 13% of a W1
prefill step). Both take float32 and bfloat16 caches (the query of the same dtype) and compute in
float32; other dtypes take the plain-PyTorch reference path unchanged.

A decode-only step's plan also carries the batch's own block tables, sequence lengths and slots
(views, not copies), and the kernel reads those: planned once for a decode graph's static buffers,
every replay sees the buffers' current contents (``graph_capture``). So does a prefill step whose
requests all feed several tokens: its keys and values are stored by a native call and the prefill
kernel takes the whole step from the batch's query starts and context lengths, which is what lets
a prefill graph replay one plan for any split of its rows (``prefill_graph_capture``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.plugin_api import AttentionBatch, AttentionCapabilities, AttentionSpec
from tokenmill.plugin_api.native import native_call
from tokenmill.plugin_api.reference_attention import (
    AttentionGroup,
    ReferenceAttentionBackend,
    ReferenceAttentionMetadata,
)
from tokenmill_cpu.kernels.dtypes import SUFFIXES, by_dtype
from tokenmill_cpu.kernels.native import MAX_GROUP, MAX_HEAD_SIZE, load_library, unavailable_reason

PREFILL_MAX_EQUAL_KEYS = 512


@dataclass
class CpuAttentionMetadata(ReferenceAttentionMetadata):
    """The reference plan, plus for a decode-only step the batch's int32 block tables [requests,
    width] (unit inner stride) and int32 sequence lengths [requests], as the batch holds them; for a
    prefill step that the native kernel takes whole, its tables, int32 query starts [requests + 1]
    and int32 context lengths [requests] (``prefill``), likewise views of the batch."""

    decode_tables: torch.Tensor | None = None
    decode_lens: torch.Tensor | None = None
    prefill: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class CpuAttentionBackend(ReferenceAttentionBackend):
    """Native in-place kernels for float32 and bfloat16 decodes and prefill chunks; plain PyTorch otherwise."""

    name = "cpu"
    api_version = (2, 0)
    capabilities = AttentionCapabilities(
        device_types=("cpu",),
        dtypes=("float32", "float16", "bfloat16"),
        kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
        graph_capture=True,
        prefill_graph_capture=True,
    )
    any_torch_device = False  # the native kernels run on the CPU only

    @classmethod
    def availability(cls) -> str | None:
        """The reason the native kernel cannot be built or loaded here (no C compiler), or None."""
        return unavailable_reason()

    def __init__(self, device: Any = None) -> None:
        super().__init__(device)
        kernels = load_library()
        self._decode_kernels = by_dtype(kernels, "paged_decode")
        self._prefill_kernels = by_dtype(kernels, "paged_prefill")
        self._write_kernels = by_dtype(kernels, "write_kv")

    def plan(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        """The reference plan; a decode-only step also keeps views of its tables and lengths, and a
        prefill step of requests that all feed several tokens (where the native kernel pays) views
        of its tables, query starts and context lengths."""
        planned = super().plan(batch)
        tables, lens = batch.block_tables, batch.seq_lens
        direct = (tables.dtype == torch.int32 and tables.dim() == 2 and tables.stride(1) == 1
                  and lens.dtype == torch.int32 and lens.is_contiguous()
                  and batch.slot_mapping.dtype == torch.int64 and batch.slot_mapping.is_contiguous())
        decode = direct and batch.max_query_len == 1
        prefill = None
        if direct and _whole_prefill_pays(batch) and batch.query_start_loc.dtype == torch.int32 \
                and batch.context_lens.dtype == torch.int32 and batch.context_lens.is_contiguous():
            prefill = (tables, batch.query_start_loc, batch.context_lens)
        return CpuAttentionMetadata(planned.slot_mapping, planned.num_tokens, planned.groups,
                                    tables if decode else None, lens if decode else None, prefill)

    def forward(self, spec: AttentionSpec, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: Any) -> torch.Tensor:
        """A step that is one decode group writes its keys and values inside the native call; any
        other step writes them first (the reference path) and attends group by group, float32 groups
        through the native kernel."""
        groups = metadata.groups
        whole = getattr(metadata, "prefill", None)
        if whole is not None and spec.head_size % 16 == 0 and _rows_of_heads(key) and _rows_of_heads(value):
            blocks = kv_cache.view(2, kv_cache.shape[1], -1)
            if self._native(spec, query, blocks, groups[0]) and key.dtype == value.dtype == blocks.dtype:
                self._write_kv(spec, blocks, key, value, metadata.slot_mapping)
                return self._prefill(spec, query, blocks, whole)
        # a prefill's rows read each other's keys, so they must all be written before any row attends
        if (len(groups) == 1 and groups[0].token_index is None and groups[0].max_query_len == 1
                and _rows_of_heads(key) and _rows_of_heads(value) and key.dtype == value.dtype == kv_cache.dtype):
            blocks = kv_cache.view(2, kv_cache.shape[1], -1)
            if self._native(spec, query, blocks, groups[0]):
                tables = getattr(metadata, "decode_tables", None)
                inputs = (tables, metadata.decode_lens) if tables is not None else _native_inputs(groups[0])
                return self._decode(spec, query, blocks, groups[0], inputs, (key, value, metadata.slot_mapping))
        return super().forward(spec, query, key, value, kv_cache, metadata)

    def _attend(self, spec: AttentionSpec, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                blocks: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
        prefill = group.max_query_len > 1
        if not self._native(spec, query, blocks, group) or (prefill and not _prefill_pays(spec, group)):
            return super()._attend(spec, query, key, value, blocks, group)
        if prefill:
            return self._prefill(spec, query, blocks, _prefill_inputs(group))
        return self._decode(spec, query, blocks, group, _native_inputs(group))

    def _prefill(self, spec: AttentionSpec, query: torch.Tensor, blocks: torch.Tensor,
                 inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The native prefill kernel with ``inputs`` = (int32 block tables, int32 query starts, int32
        context lengths) over the tokens' rows (their keys and values already in the cache)."""
        tables, starts, contexts = inputs
        query = query.contiguous()
        out = torch.empty_like(query)
        block_size = blocks.shape[2] // (spec.num_kv_heads * spec.head_size)
        native_call(
            self._prefill_kernels[blocks.dtype], query.data_ptr(), blocks.data_ptr(), tables.data_ptr(),
            starts.data_ptr(), contexts.data_ptr(), out.data_ptr(), contexts.shape[0], spec.num_heads,
            spec.num_kv_heads, spec.head_size, block_size, blocks.shape[1], tables.stride(0), spec.scale,
            spec.sliding_window or 0, spec.logits_soft_cap or 0.0,
        )
        return out

    def _write_kv(self, spec: AttentionSpec, blocks: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  slots: torch.Tensor) -> None:
        """Store the step's keys and values at their int64 slots (as the reference's write does)."""
        block_size = blocks.shape[2] // (spec.num_kv_heads * spec.head_size)
        refused = native_call(self._write_kernels[blocks.dtype], blocks.data_ptr(), blocks.shape[1], block_size,
                              spec.num_kv_heads * spec.head_size, key.data_ptr(), key.stride(0), value.data_ptr(),
                              value.stride(0), slots.data_ptr(), slots.shape[0])
        if refused:
            raise IndexError(f"{refused} slot(s) outside the KV cache of {blocks.shape[1] * block_size} slots")

    @staticmethod
    def _native(spec: AttentionSpec, query: torch.Tensor, blocks: torch.Tensor, group: AttentionGroup) -> bool:
        """Whether a native kernel takes this group: a float32 or bfloat16 cache, the query of its dtype."""
        return (query.dtype == blocks.dtype and blocks.dtype in SUFFIXES and spec.causal
                and spec.head_size <= MAX_HEAD_SIZE and spec.num_heads // spec.num_kv_heads <= MAX_GROUP)

    def _decode(self, spec: AttentionSpec, query: torch.Tensor, blocks: torch.Tensor, group: AttentionGroup,
                inputs: tuple[torch.Tensor, torch.Tensor],
                write: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The native kernel over a decode group with ``inputs`` = (int32 block tables, int32 sequence
        lengths); with ``write`` = (keys, values, int64 slots) it first stores each request's new key
        and value in the cache."""
        tables, lens = inputs
        query = query.contiguous()
        out = torch.empty_like(query)
        num_blocks = blocks.shape[1]
        block_size = blocks.shape[2] // (spec.num_kv_heads * spec.head_size)
        stores = (None, 0, None, 0, None)
        if write is not None:
            keys, values, slots = write
            slots = slots if slots.dtype == torch.int64 else slots.to(torch.int64)
            stores = (keys.data_ptr(), keys.stride(0), values.data_ptr(), values.stride(0), slots.data_ptr())
        native_call(
            self._decode_kernels[blocks.dtype], query.data_ptr(), blocks.data_ptr(), tables.data_ptr(),
            lens.data_ptr(), out.data_ptr(), group.num_requests, spec.num_heads, spec.num_kv_heads, spec.head_size,
            block_size, num_blocks, tables.stride(0), spec.scale, spec.sliding_window or 0, spec.logits_soft_cap or 0.0,
            *stores,
        )
        return out


def _rows_of_heads(x: torch.Tensor) -> bool:
    """Whether ``x`` [T, heads, head_size] has contiguous heads within each row (any row stride)."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def _prefill_pays(spec: AttentionSpec, group: AttentionGroup) -> bool:
    """Whether the native prefill kernel beats the reference's padded SDPA on this group: always when
    the reference would pad (unequal chunk lengths: 2.7x faster on a W1 prefill step), and up to 512
    keys otherwise; past that, with equal lengths, PyTorch's flash attention was 10-15% faster on
    two cores. The kernel's vectors are 16 floats of a head."""
    return spec.head_size % 16 == 0 and (group.pad_index is not None or group.max_seq_len <= PREFILL_MAX_EQUAL_KEYS)


def _whole_prefill_pays(batch: AttentionBatch) -> bool:
    """Whether a step is a prefill the native kernel takes whole: every request feeds several tokens
    (a step mixing in decodes keeps the decode kernel for those), on the terms of ``_prefill_pays``."""
    lens = batch.query_lens_cpu
    return (batch.max_query_len > 1 and min(lens) > 1
            and (len(set(lens)) > 1 or batch.max_seq_len <= PREFILL_MAX_EQUAL_KEYS))


def _native_inputs(group: AttentionGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 block tables and sequence lengths of a decode group, built once per step (the group
    object lives for one step and is shared by every layer)."""
    cached = getattr(group, "_native_inputs", None)
    if cached is None:
        tables = group.block_index.to(torch.int32).contiguous()
        lens = (group.query_positions[:, 0] + 1).to(torch.int32).contiguous()
        cached = (tables, lens)
        object.__setattr__(group, "_native_inputs", cached)
    return cached


def _prefill_inputs(group: AttentionGroup) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int32 block tables, query row starts [requests + 1] and context lengths of a prefill group,
    built once per step. Padding repeats a request's last position, so its last column is its length - 1."""
    cached = getattr(group, "_prefill_inputs", None)
    if cached is None:
        positions = group.query_positions
        contexts = positions[:, 0]
        starts = torch.zeros(group.num_requests + 1, dtype=torch.int64)
        torch.cumsum(positions[:, -1] + 1 - contexts, 0, out=starts[1:])
        cached = tuple(t.to(torch.int32).contiguous() for t in (group.block_index, starts, contexts))
        object.__setattr__(group, "_prefill_inputs", cached)
    return cached
