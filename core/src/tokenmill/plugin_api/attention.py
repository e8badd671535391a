"""The AttentionBackend contract: paged attention over a block-structured KV cache.

Every step the model runner flattens the scheduled requests into one token batch (prefill chunks
and decodes mixed, request after request), builds an ``AttentionBatch`` (``AttentionBatch.build``),
calls ``plan`` once, and passes the returned metadata to ``forward`` in every attention layer.
``forward`` first writes the step's new keys and values into the cache at ``slot_mapping``, then
attends each query token to all keys of its own request up to and including its own position.

All calls happen in the engine (worker) process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tokenmill.plugin_api.attention_batch import AttentionBatch

__all__ = ["AttentionBackend", "AttentionBatch", "AttentionCapabilities", "AttentionSpec"]


@dataclass(frozen=True)
class AttentionSpec:
    """What one attention layer needs; fixed at model construction."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    dtype: str  # compute dtype name, e.g. "float32"
    kv_cache_dtype: str = "auto"  # "auto" (= dtype) or "fp8" / "fp8_e4m3" / "fp8_e5m2"
    block_size: int = 16
    sliding_window: int | None = None  # attend to at most this many most recent positions
    logits_soft_cap: float | None = None  # softcap * tanh(scores / softcap) before softmax
    causal: bool = True


@dataclass(frozen=True)
class AttentionCapabilities:
    """What a backend supports; ``None`` in a field means "anything"."""

    device_types: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    head_sizes: tuple[int, ...] | None = None
    block_sizes: tuple[int, ...] | None = None
    sliding_window: bool = True
    logits_soft_cap: bool = True
    non_causal: bool = False
    families: tuple[str, ...] = ()  # platform family tags this backend can run on, besides device_types
    graph_capture: bool = False
    """Whether a decode-only step may be planned once and replayed many times (CUDA graphs): for a
    batch where every request has one query token, ``plan`` keeps the batch's device tensors
    themselves (no copies), derives host-side state only from ``query_lens_cpu``, ``num_tokens``,
    ``max_query_len`` and ``block_size``, and ``forward`` reads sequence lengths, block tables and
    slots from those device tensors alone and never synchronises with the host. One plan then
    stays valid while the tensors' contents change between replays. Default False."""
    prefill_graph_capture: bool = False
    """The same promise for a prefill step (``max_query_len > 1``) whose every request feeds more than
    one token: ``plan`` keeps the batch's tensors (query_start_loc, seq_lens, context_lens,
    block_tables, slot_mapping) and ``forward`` reads query starts, lengths, tables and slots from
    them alone, so the plan made for one padded prefill stays valid for any split of the same number
    of tokens, including requests of zero or one token (since plugin API 1.5). Default False."""


class AttentionBackend:
    """Base class for an attention backend plugin. ``name``, ``capabilities`` and ``forward`` are
    required; ``validate``, ``kv_cache_shape`` and ``plan`` have working defaults."""

    name: ClassVar[str]
    """Unique short name; what ``--attention-backend`` and platform preferences refer to."""

    api_version: ClassVar[tuple[int, int]]
    """The plugin API version the plugin was built against, e.g. ``(2, 0)``. Required, in the body of
    the class the entry point names (an inherited value does not count); checked at discovery."""

    capabilities: ClassVar[AttentionCapabilities] = AttentionCapabilities()
    """Declared support, read without running any kernel (for selection and explanations)."""

    @classmethod
    def availability(cls) -> str | None:
        """Why the backend cannot run in this installation at all (a missing kernel library),
        or None. Optional (default None). Called at selection, must be cheap."""
        return None

    @classmethod
    def validate(cls, spec: AttentionSpec, device_type: str, families: tuple[str, ...] = ()) -> list[str]:
        """Reasons this backend cannot serve a layer like ``spec`` on ``device_type``; empty when
        it can. Optional: the default checks ``capabilities`` field by field. Called at selection
        (also by ``tokenmill plugins explain``), in any process."""
        caps = cls.capabilities
        reasons = []
        unavailable = cls.availability()
        if unavailable:
            reasons.append(unavailable)
        if device_type not in caps.device_types and not set(families) & set(caps.families):
            reasons.append(f"runs on {', '.join(caps.device_types)}, not {device_type}")
        if spec.dtype not in caps.dtypes:
            reasons.append(f"dtype {spec.dtype} not supported (supports {', '.join(caps.dtypes)})")
        if spec.kv_cache_dtype not in caps.kv_cache_dtypes:
            reasons.append(f"kv-cache dtype {spec.kv_cache_dtype} not supported")
        if caps.head_sizes is not None and spec.head_size not in caps.head_sizes:
            reasons.append(f"head size {spec.head_size} not supported")
        if caps.block_sizes is not None and spec.block_size not in caps.block_sizes:
            reasons.append(f"block size {spec.block_size} not supported (supports {caps.block_sizes})")
        if spec.sliding_window is not None and not caps.sliding_window:
            reasons.append("sliding-window attention not supported")
        if spec.logits_soft_cap is not None and not caps.logits_soft_cap:
            reasons.append("logits soft-capping not supported")
        if not spec.causal and not caps.non_causal:
            reasons.append("non-causal (encoder) attention not supported")
        return reasons

    def __init__(self, device: Any = None) -> None:
        self.device = device

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """Shape of one layer's cache tensor. Optional; default
        ``(2, num_blocks, block_size, num_kv_heads, head_size)`` (keys, then values).
        Called once when the cache is allocated."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    def kv_cache_torch_dtype(self, spec: AttentionSpec) -> Any:
        """The torch dtype of the cache tensor for ``spec``. Optional; default the compute dtype
        for "auto" and ``float8_e4m3fn`` / ``float8_e5m2`` for fp8."""
        import torch

        if spec.kv_cache_dtype in ("fp8", "fp8_e4m3"):
            return torch.float8_e4m3fn
        if spec.kv_cache_dtype == "fp8_e5m2":
            return torch.float8_e5m2
        return getattr(torch, spec.dtype)

    def plan(self, batch: AttentionBatch) -> Any:
        """Turn the step's batch into backend metadata, once per step before the forward pass.
        Optional; default returns ``batch`` itself."""
        return batch

    def forward(self, spec: AttentionSpec, query: Any, key: Any, value: Any, kv_cache: Any, metadata: Any) -> Any:
        """Write ``key``/``value`` [T, num_kv_heads, head_size] into ``kv_cache`` at the batch's
        slot mapping, then return attention output [T, num_heads, head_size] for ``query``
        [T, num_heads, head_size]. Required; called by every attention layer every step."""
        raise NotImplementedError
