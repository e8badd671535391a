"""AttentionScenario: a ``BatchMix`` as block tables and random inputs, run step by step through any backend.

The steps run as the engine would run them. Inputs are drawn in float32 and rounded once to the
test dtype, so a backend computing in that dtype and the float32 reference see exactly the same
numbers. Cache tensors start filled with random values (as reused blocks would be), so a backend
reading slots it should mask is caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.plugin_api import AttentionBackend, AttentionSpec
from tokenmill_testkit.attention_batch import ScheduledRequest, make_attention_batch
from tokenmill_testkit.attention_cases import BatchMix


@dataclass(frozen=True)
class ScenarioStep:
    request_ids: tuple[int, ...]
    requests: tuple[ScheduledRequest, ...]


@dataclass
class LayerRun:
    """What one layer produced: the output of every step and the cache it wrote."""

    outputs: list[torch.Tensor]
    cache: torch.Tensor


class AttentionScenario:
    """Block tables and inputs for ``mix``; ``num_layers`` layers share every step's metadata."""

    def __init__(self, mix: BatchMix, num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
                 dtype: str, num_layers: int = 1, seed: int = 0) -> None:
        self.mix = mix
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.generator = torch.Generator().manual_seed(seed)
        shared = {request: (owner, blocks) for request, owner, blocks in mix.shared_blocks}
        prefix = {request: blocks * block_size for request, (_, blocks) in shared.items()}
        totals: dict[int, int] = dict(prefix)
        for step in mix.steps:
            for request, tokens in step:
                totals[request] = totals.get(request, 0) + tokens
        self.num_blocks, self.block_tables = self._allocate(totals, shared)
        round_to = getattr(torch, dtype)
        self.inputs = [
            {r: self._draw(totals[r], num_heads, num_kv_heads, head_size, round_to) for r in sorted(totals)}
            for _ in range(num_layers)
        ]
        for layer in self.inputs:
            for request, (owner, _) in shared.items():
                for name in ("k", "v"):  # a prefix hit means identical tokens, hence identical K/V
                    layer[request][name][: prefix[request]] = layer[owner][name][: prefix[request]]
        self.steps = self._plan_steps(prefix)

    def _allocate(self, totals: dict[int, int], shared: dict[int, tuple[int, int]]) -> tuple[int, dict]:
        bs = self.block_size
        own = {r: -(-total // bs) - shared.get(r, (0, 0))[1] for r, total in totals.items()}
        num_blocks = sum(own.values()) + 2  # two blocks nobody owns
        free = torch.randperm(num_blocks, generator=self.generator).tolist()  # scattered, block 0 included
        tables: dict[int, tuple[int, ...]] = {}
        for request in sorted(totals):
            owner, blocks = shared.get(request, (None, 0))
            if owner is not None and owner not in tables:
                raise ValueError(f"request {request} shares blocks of request {owner}, which must have a lower id")
            head = tables[owner][:blocks] if owner is not None else ()
            tables[request] = head + tuple(free[: own[request]])
            del free[: own[request]]
        return num_blocks, tables

    def _draw(self, length: int, heads: int, kv_heads: int, head_size: int, round_to: torch.dtype) -> dict:
        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=self.generator).to(round_to).float()

        return {"q": rand(length, heads, head_size), "k": rand(length, kv_heads, head_size),
                "v": rand(length, kv_heads, head_size)}

    def _plan_steps(self, prefix: dict[int, int]) -> list[ScenarioStep]:
        cached = dict(prefix)
        steps = []
        for step in self.mix.steps:
            requests = []
            for request, tokens in step:
                context = cached.get(request, 0)
                requests.append(ScheduledRequest(self.block_tables[request], context, tokens))
                cached[request] = context + tokens
            steps.append(ScenarioStep(tuple(r for r, _ in step), tuple(requests)))
        return steps

    def step_inputs(self, step: ScenarioStep, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """float32 (q, k, v) of the step's new tokens, in batch order."""
        data = self.inputs[layer]
        pick = [(data[r], s.context_len, s.seq_len) for r, s in zip(step.request_ids, step.requests, strict=True)]
        return tuple(torch.cat([d[name][lo:hi] for d, lo, hi in pick]) for name in ("q", "k", "v"))

    def written_slots(self) -> torch.Tensor:
        """Every cache slot some step wrote, sorted."""
        slots = {slot for step in self.steps for r in step.requests for slot in r.slots(self.block_size)}
        return torch.tensor(sorted(slots), dtype=torch.int64)

    def allocate_cache(self, backend: AttentionBackend, spec: AttentionSpec, device: Any) -> torch.Tensor:
        """The layer's cache in the backend's own shape and dtype, filled with random values."""
        shape = backend.kv_cache_shape(self.num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        dtype = backend.kv_cache_torch_dtype(spec)
        if not (dtype.is_floating_point):
            return torch.zeros(shape, dtype=dtype, device=device)
        return torch.randn(shape, generator=self.generator).to(dtype).to(device)

    def run(self, backend: AttentionBackend, specs: Sequence[AttentionSpec], device: Any) -> list[LayerRun]:
        """Run every step through ``backend``: one ``plan`` per step, one ``forward`` per layer."""
        runs = [LayerRun([], self.allocate_cache(backend, spec, device)) for spec in specs]
        for step in self.steps:
            metadata = backend.plan(make_attention_batch(step.requests, self.block_size, device))
            for layer, (spec, run) in enumerate(zip(specs, runs, strict=True)):
                dtype = getattr(torch, spec.dtype)
                q, k, v = (t.to(dtype).to(device) for t in self.step_inputs(step, layer))
                run.outputs.append(backend.forward(spec, q, k, v, run.cache, metadata))
        return runs
