"""TritonAttentionBackend: paged attention for every device Triton compiles for (CUDA, ROCm, XPU).

Importing this module is cheap: triton and the kernels are imported on first ``plan``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Any

from tokenmill.plugin_api import AttentionBackend, AttentionBatch, AttentionCapabilities, AttentionSpec
from tokenmill.plugin_api.triton import CPU_REASON, NOT_INSTALLED_REASON, interpreter_enabled, refuse_cpu_tensors

MAX_HEAD_SIZE = 256


class TritonAttentionBackend(AttentionBackend):
    """One Triton kernel for mixed prefill + decode steps over the paged cache, plus a Triton
    KV-cache write. Any head size up to 256 (padded to a power of two inside the kernel), any
    block size, GQA/MQA, sliding window, soft-capping, and fp8 KV caches (scale 1.0).

    Graph capture: a decode-only plan holds the batch's device tensors as they are, and its tile
    map (one tile per request) depends only on the number of requests; the kernels read lengths,
    block tables and slots from the device. The tile map is built on the host the first time a
    layer runs a plan, so a plan must run once eagerly before it is captured."""

    name = "triton"
    api_version = (2, 0)
    capabilities = AttentionCapabilities(
        device_types=("cuda", "xpu"),
        dtypes=("float32", "float16", "bfloat16"),
        kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
        head_sizes=tuple(range(8, MAX_HEAD_SIZE + 1, 8)),
        block_sizes=(8, 16, 32, 64, 128),
        sliding_window=True,
        logits_soft_cap=True,
        non_causal=True,
        families=("triton",),
        graph_capture=True,  # decode plans hold only the batch's tensors and a tile map fixed by the batch size
    )

    @classmethod
    def availability(cls) -> str | None:
        """Why Triton cannot run here: the package is missing or older than 3.0; None otherwise."""
        if importlib.util.find_spec("triton") is None:
            return NOT_INSTALLED_REASON
        version = importlib.metadata.version("triton")
        if int(version.split(".")[0]) < 3:
            return f"triton {version} is too old (needs >= 3.0)"
        return None

    @classmethod
    def validate(cls, spec: AttentionSpec, device_type: str, families: tuple[str, ...] = ()) -> list[str]:
        """The capability checks of the base class, plus: never a serving choice on the CPU,
        head sizes must be divisible, and a sliding window needs causal attention."""
        reasons = super().validate(spec, device_type, families)
        if device_type == "cpu":
            reasons.append(CPU_REASON)
        if spec.num_kv_heads <= 0 or spec.num_heads % spec.num_kv_heads:
            reasons.append(f"{spec.num_heads} query heads do not divide into {spec.num_kv_heads} kv heads")
        if spec.sliding_window is not None and not spec.causal:
            reasons.append("a sliding window is only supported with causal attention")
        return reasons

    def plan(self, batch: AttentionBatch) -> Any:
        """Keep the step's device tensors and host-side sizes; the kernel's tile-to-request map
        is built from ``query_lens_cpu`` on first use and shared by all layers of the step."""
        from tokenmill_attn_triton.metadata import TritonAttentionMetadata

        refuse_cpu_tensors(batch.slot_mapping, "triton attention backend", interpreter_enabled())
        return TritonAttentionMetadata(
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_tables=batch.block_tables,
            slot_mapping=batch.slot_mapping,
            query_lens_cpu=list(batch.query_lens_cpu),
            max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len,
            num_tokens=batch.num_tokens,
            block_size=batch.block_size,
        )

    def forward(self, spec: AttentionSpec, query: Any, key: Any, value: Any, kv_cache: Any, metadata: Any) -> Any:
        """Write ``key``/``value`` into ``kv_cache`` with the Triton write kernel, then run the
        unified attention kernel; returns a new [T, num_heads, head_size] tensor. Rows past the
        step's real tokens (padding) come back as zeros."""
        import torch

        from tokenmill_attn_triton.kv_cache_write import write_kv_cache
        from tokenmill_attn_triton.unified_attention import unified_attention

        write_kv_cache(key, value, kv_cache, metadata.slot_mapping)
        query = query if query.stride(-1) == 1 else query.contiguous()
        out = torch.empty_like(query)
        if query.shape[0] > metadata.num_tokens:
            out[metadata.num_tokens :].zero_()
        unified_attention(
            out,
            query,
            kv_cache,
            metadata,
            scale=spec.scale,
            sliding_window=spec.sliding_window,
            logits_soft_cap=spec.logits_soft_cap,
            causal=spec.causal,
        )
        return out
