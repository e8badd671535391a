"""KV-cache sizing from device memory measured after the model is loaded and a profiling step has run.

The budget is ``gpu_memory_utilization`` x total, less what is in use once the model is loaded and
the largest step the scheduler can make has run (its activations' peak stays reserved by the
framework's caching allocator, so the device reports it as used).

``kv_cache_sizing`` is the arithmetic, given the numbers; ``profile_memory_in_use`` runs the
profiling forward pass on a throwaway one-block cache and reads the platform's memory afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext
from tokenmill.plugin_api import AttentionBackend, AttentionBatch, MemoryInfo, Platform

GIB = 1 << 30


@dataclass(frozen=True)
class KVCacheSizing:
    """How many KV-cache blocks fit: ``budget = utilization * total - in_use`` bytes."""

    total: int
    utilization: float
    in_use: int
    bytes_per_block: int

    @property
    def budget(self) -> int:
        return int(self.utilization * self.total) - self.in_use

    @property
    def num_blocks(self) -> int:
        return max(self.budget, 0) // self.bytes_per_block

    def describe(self) -> str:
        """One line for the startup log."""
        return (f"KV cache: {self.num_blocks} blocks = {self.budget / GIB:.2f} GiB (gpu_memory_utilization "
                f"{self.utilization} of {self.total / GIB:.1f} GiB, less {self.in_use / GIB:.2f} GiB in use after "
                f"loading the model and a profiling step)")


def kv_cache_sizing(memory: MemoryInfo, utilization: float, bytes_per_block: int) -> KVCacheSizing:
    """Size the cache from memory read after the profiling step; raises ValueError when fewer than
    two blocks fit (block 0 is the reserved null block)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    sizing = KVCacheSizing(total=memory.total, utilization=utilization, in_use=memory.total - memory.free,
                           bytes_per_block=bytes_per_block)
    if sizing.num_blocks < 2:
        raise ValueError(
            f"no room for the KV cache: gpu_memory_utilization {utilization} of {memory.total / GIB:.1f} GiB is "
            f"{utilization * memory.total / GIB:.2f} GiB, but {sizing.in_use / GIB:.2f} GiB is already in use after "
            f"loading the model and a profiling step; raise --gpu-memory-utilization, lower "
            f"--max-num-batched-tokens, or free device memory")
    return sizing


def profiling_batch(num_tokens: int, max_model_len: int, block_size: int, device: torch.device) -> AttentionBatch:
    """``num_tokens`` prompt tokens as fresh prefills of at most ``max_model_len`` each, every slot in
    block 0 (the profiling cache has that block only)."""
    lengths = [min(max_model_len, num_tokens - start) for start in range(0, num_tokens, max_model_len)]
    blocks = -(-max(lengths) // block_size)
    return AttentionBatch.build(lengths, [0] * len(lengths), [[0] * blocks] * len(lengths), block_size, device=device)


@torch.inference_mode()
def profile_memory_in_use(model: nn.Module, backend: AttentionBackend, platform: Platform, *, num_tokens: int,
                          num_sampled: int, max_model_len: int, block_size: int) -> MemoryInfo:
    """Run one forward pass of ``num_tokens`` tokens and the logits of ``num_sampled`` rows, then
    return the platform's memory (``total - free`` includes the step's peak)."""
    device = platform.torch_device()
    caches = [torch.zeros(backend.kv_cache_shape(1, block_size, s.num_kv_heads, s.head_size),
                          dtype=backend.kv_cache_torch_dtype(s), device=device) for s in model.attention_specs()]
    batch = profiling_batch(num_tokens, max_model_len, block_size, device)
    positions = torch.cat([torch.arange(n, device=device) for n in batch.query_lens_cpu])
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    ctx = AttentionContext(backend=backend, metadata=backend.plan(batch), kv_caches=caches)
    hidden = model(input_ids, positions, ctx)
    logits = model.compute_logits(hidden[-min(num_sampled, num_tokens):])
    logits.softmax(dim=-1).argmax(dim=-1)
    platform.synchronize()
    del hidden, logits, caches, ctx
    return platform.memory_info()
