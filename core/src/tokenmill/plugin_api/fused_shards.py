"""Fused linear layers and the checkpoint modules they stack: which modules a layer loads, where a
shard's output rows sit, and whether a format quantizes the whole layer.

Llama-family models fuse ``q_proj``/``k_proj``/``v_proj`` into ``qkv_proj`` and ``gate_proj``/``up_proj``
into ``gate_up_proj``; shard ``i`` of a ``LinearSpec`` holds output rows
``sum(output_sizes[:i]) : sum(output_sizes[:i + 1])``.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenmill.plugin_api.quantization import LinearSpec

FUSED_SHARDS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""Fused layer name -> the checkpoint modules it stacks, in shard order."""


def shard_modules(spec: LinearSpec) -> list[str]:
    """The checkpoint module paths the (possibly fused) layer ``spec`` loads, in shard order."""
    parent, _, leaf = spec.prefix.rpartition(".")
    shards = FUSED_SHARDS.get(leaf)
    if shards is not None and len(shards) == len(spec.output_sizes):
        return [f"{parent}.{shard}" for shard in shards]
    return [spec.prefix]


def shard_span(spec: LinearSpec, shard_index: int | None) -> tuple[int, int, int]:
    """(index, first output row, output rows) of shard ``shard_index``; None means the whole,
    unfused layer. ``ValueError`` for an index the layer does not have."""
    if shard_index is None:
        return 0, 0, spec.out_features
    if not 0 <= shard_index < len(spec.output_sizes):
        raise ValueError(f"{spec.prefix}: no shard {shard_index} in a layer of {len(spec.output_sizes)} shards")
    return shard_index, sum(spec.output_sizes[:shard_index]), spec.output_sizes[shard_index]


def quantized_whole(spec: LinearSpec, quantizes: Callable[[str], bool]) -> bool:
    """Whether ``quantizes`` (module path -> stored quantized) holds for every checkpoint module of
    ``spec``; ``ValueError`` when it holds for only some, since one layer has one format."""
    covered = {quantizes(module) for module in shard_modules(spec)}
    if len(covered) > 1:
        raise ValueError(f"{spec.prefix}: the checkpoint quantizes only some of the shards fused into this layer")
    return covered.pop()
