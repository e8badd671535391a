"""FakeDeviceAttentionBackend: paged attention written for clarity, one request at a time.

The cache layout is our own choice -- ``[num_blocks, 2 (k/v), num_kv_heads, block_size, head_size]``
-- to show that core treats the cache as opaque: it allocates ``kv_cache_shape(...)`` and hands the
tensor back to ``forward``.
"""

from __future__ import annotations

from typing import Any

from tokenmill.plugin_api import AttentionBackend, AttentionBatch, AttentionCapabilities, AttentionSpec


class FakeDeviceAttentionBackend(AttentionBackend):
    """Per-request gather + dense attention in float32, for the fakedev platform."""

    name = "fakedev"
    api_version = (2, 0)
    capabilities = AttentionCapabilities(
        device_types=(),  # no plain device type: only platforms tagged with our family qualify
        families=("fakedev",),
        dtypes=("float32", "float16", "bfloat16"),
        kv_cache_dtypes=("auto",),
        sliding_window=True,
        logits_soft_cap=True,
    )

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """Block-major, heads before positions."""
        return (num_blocks, 2, num_kv_heads, block_size, head_size)

    def forward(self, spec: AttentionSpec, query: Any, key: Any, value: Any, kv_cache: Any,
                metadata: AttentionBatch) -> Any:
        """Write this step's K/V at ``slot_mapping``, then attend each request's queries to its
        whole sequence. ``plan`` was not overridden, so ``metadata`` is the AttentionBatch."""
        block_size = metadata.block_size
        self._write(kv_cache, key, value, metadata.slot_mapping, block_size)
        output = query.new_empty(query.shape)
        start = 0
        # Invariant: query_lens_cpu / seq_lens_cpu mirror the device tensors; looping over the CPU
        # lists avoids a device sync per request.
        for i, (query_len, seq_len) in enumerate(zip(metadata.query_lens_cpu, metadata.seq_lens_cpu, strict=True)):
            keys, values = self._gather(kv_cache, metadata.block_tables[i], seq_len, block_size)
            end = start + query_len
            output[start:end] = self._attend(spec, query[start:end], keys, values, seq_len - query_len)
            start = end
        return output

    @staticmethod
    def _write(kv_cache: Any, key: Any, value: Any, slot_mapping: Any, block_size: int) -> None:
        blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
        kv_cache[:, 0][blocks, :, offsets] = key.to(kv_cache.dtype)
        kv_cache[:, 1][blocks, :, offsets] = value.to(kv_cache.dtype)

    @staticmethod
    def _gather(kv_cache: Any, block_table: Any, seq_len: int, block_size: int) -> tuple[Any, Any]:
        """[seq_len, num_kv_heads, head_size] keys and values of one request, in position order."""
        num_blocks = -(-seq_len // block_size)
        blocks = kv_cache[block_table[:num_blocks].long()]  # [n, 2, kv_heads, block_size, head_size]
        per_position = blocks.permute(1, 0, 3, 2, 4).flatten(1, 2)  # [2, n * block_size, kv_heads, head_size]
        return per_position[0, :seq_len], per_position[1, :seq_len]

    @staticmethod
    def _attend(spec: AttentionSpec, query: Any, keys: Any, values: Any, context_len: int) -> Any:
        """Dense causal attention of ``query`` [q, heads, d] over ``keys``/``values`` [s, kv_heads, d];
        query token ``j`` sits at position ``context_len + j``."""
        import torch

        group = spec.num_heads // spec.num_kv_heads  # grouped-query attention: heads share a kv head
        keys = keys.float().repeat_interleave(group, dim=1)
        values = values.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * spec.scale
        if spec.logits_soft_cap is not None:
            scores = spec.logits_soft_cap * torch.tanh(scores / spec.logits_soft_cap)
        query_pos = torch.arange(query.shape[0], device=query.device)[:, None] + context_len
        key_pos = torch.arange(keys.shape[0], device=query.device)[None, :]
        allowed = key_pos <= query_pos
        if spec.sliding_window is not None:  # at most sliding_window positions, this one included
            allowed &= key_pos > query_pos - spec.sliding_window
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
