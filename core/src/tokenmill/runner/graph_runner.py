"""DecodeGraphRunner: decode-only steps replayed through one graph per padded batch size.

A decode-only step (every request feeds one token) of ``n`` requests is padded up to the smallest
bucket ``>= n`` and run through the graph captured for that bucket. The graph reads static input
buffers that each step copies into: token ids, positions, slot mapping, sequence and context
lengths, block tables. Padding rows are requests of one token at position 0 whose key and value go
to slot ``padding_slot`` of block 0, the reserved null block no request owns, with a sequence length
of 1: they read and write only that block, never a real request's cache. Their hidden states are
sliced off.

The graph itself is an abstraction (``DecodeGraph`` of ``tokenmill.plugin_api.graphs``): the
platform provides the captured kind (CUDA graphs, through ``Platform.create_graph``), and
``EagerDecodeGraph`` runs the same padded static-buffer path without capture, so the whole path is
testable on the CPU. A captured graph
freezes the attention backend's plan made at capture time, which is only sound for backends that
declare ``AttentionCapabilities.graph_capture``.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext
from tokenmill.plugin_api import AttentionBackend, AttentionBatch, Platform
from tokenmill.plugin_api.graphs import DecodeGraph, GraphCaptureDeclined
from tokenmill.runner.step_inputs import StepInputs

logger = logging.getLogger("tokenmill")

NULL_BLOCK_ID = 0


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Padded batch sizes 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, ... up to ``max_num_seqs``
    (included as the last bucket when it falls between two of them)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    sizes, power = [1, 2, 4, 8], 16
    while sizes[-1] < max_num_seqs:
        sizes += [power, power * 3 // 2]
        power *= 2
    kept = [s for s in sizes if s < max_num_seqs]
    return (*kept, max_num_seqs)


class EagerDecodeGraph:
    """The graph contract without recording: every replay runs ``forward`` again.

    With ``freeze_plan`` it plans once at capture, exactly as a recorded graph does, which checks on
    any device that a backend's plan stays valid while only the buffers' contents change.
    """

    def __init__(self, freeze_plan: bool = False) -> None:
        self.freezes_plan = freeze_plan
        self._plan: Callable[[], Any] | None = None
        self._forward: Callable[[Any], torch.Tensor] | None = None
        self._metadata: Any = None

    def capture(self, plan: Callable[[], Any], forward: Callable[[Any], torch.Tensor]) -> None:
        """Remember the callables and run them once, as a capture's warm-up would."""
        self._plan, self._forward = plan, forward
        self._metadata = plan() if self.freezes_plan else None
        forward(self._metadata if self.freezes_plan else plan())

    def replay(self) -> torch.Tensor:
        """Run ``forward`` on the buffers as they are now (re-planning unless the plan is frozen)."""
        if self._forward is None or self._plan is None:
            raise RuntimeError("replay() before capture()")
        return self._forward(self._metadata if self.freezes_plan else self._plan())


class DecodeBuffers:
    """Static inputs for up to ``max_batch`` one-token requests; every graph reads views of these."""

    def __init__(self, max_batch: int, max_blocks_per_seq: int, device: torch.device) -> None:
        self.max_batch = max_batch
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self._real_rows = max_batch  # rows at or past this index hold padding in every buffer

    def pad(self, start: int, padding_slot: int) -> None:
        """Make rows ``start:`` padding requests (rows past the previous step's real ones already are)."""
        end = self._real_rows
        if start < end:
            self.input_ids[start:end].zero_()
            self.positions[start:end].zero_()
            self.slot_mapping[start:end].fill_(padding_slot)
            self.seq_lens[start:end].fill_(1)
            self.context_lens[start:end].zero_()
            self.block_tables[start:end].fill_(NULL_BLOCK_ID)
        self._real_rows = start

    def load(self, step: StepInputs, padding_slot: int) -> None:
        """Copy a decode-only step's ``n`` requests into rows ``:n`` and pad the rest."""
        batch = step.attention
        n = batch.num_requests
        self.pad(n, padding_slot)
        self.input_ids[:n].copy_(step.input_ids, non_blocking=True)
        self.positions[:n].copy_(step.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(batch.seq_lens, non_blocking=True)
        self.context_lens[:n].copy_(batch.context_lens, non_blocking=True)
        width = batch.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(batch.block_tables, non_blocking=True)
        self.block_tables[:n, width:].fill_(NULL_BLOCK_ID)
        self._real_rows = n

    def batch(self, bucket: int, seq_lens_cpu: list[int], block_size: int) -> AttentionBatch:
        """The AttentionBatch of the first ``bucket`` rows, every tensor a view of the buffers."""
        return AttentionBatch.build(
            [1] * bucket, [n - 1 for n in seq_lens_cpu], self.block_tables[:bucket], block_size,
            slot_mapping=self.slot_mapping[:bucket],
            length_tensors=(self.query_start_loc[: bucket + 1], self.seq_lens[:bucket], self.context_lens[:bucket]))


class BucketGraphRunner:
    """What the decode and the prefill graph runners share: the model, attention backend and KV caches
    a captured forward runs with, the null block's padding slot, the buckets and their graphs. A
    subclass sets ``buffers`` (static ``input_ids`` and ``positions`` at least)."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, kv_caches: list[torch.Tensor], *,
                 buckets: tuple[int, ...], block_size: int, new_graph: Callable[[], DecodeGraph],
                 padding_slot: int = NULL_BLOCK_ID) -> None:
        if not 0 <= padding_slot < block_size:
            raise ValueError(f"padding_slot {padding_slot} is not a slot of the null block (block size {block_size})")
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.padding_slot = padding_slot
        self.buckets = buckets
        self.graphs: dict[int, DecodeGraph] = {}
        self._new_graph = new_graph

    def bucket_for(self, size: int) -> int:
        """The smallest bucket that holds ``size`` (requests or tokens)."""
        return self.buckets[bisect.bisect_left(self.buckets, size)]

    def _forward(self, bucket: int, metadata: Any) -> torch.Tensor:
        ctx = AttentionContext(backend=self.backend, metadata=metadata, kv_caches=self.kv_caches)
        return self.model(self.buffers.input_ids[:bucket], self.buffers.positions[:bucket], ctx)


class DecodeGraphRunner(BucketGraphRunner):
    """Pads decode-only steps to a bucket and replays that bucket's graph; ``capture`` first."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, kv_caches: list[torch.Tensor], *,
                 max_num_seqs: int, max_blocks_per_seq: int, block_size: int, device: torch.device,
                 new_graph: Callable[[], DecodeGraph], padding_slot: int = NULL_BLOCK_ID) -> None:
        super().__init__(model, backend, kv_caches, buckets=decode_buckets(max_num_seqs), block_size=block_size,
                         new_graph=new_graph, padding_slot=padding_slot)
        self.buffers = DecodeBuffers(self.buckets[-1], max_blocks_per_seq, device)
        self._seq_lens_cpu: list[int] = []  # host lengths of the rows now in the buffers (for eager plans)
        self.capture_seconds = 0.0

    @torch.inference_mode()
    def capture(self) -> bool:
        """Capture every bucket's graph, largest first (smaller ones reuse its memory). A bucket whose
        forward declines capture (GraphCaptureDeclined: e.g. a kernel that is native only up to some
        rows) is dropped with the larger ones, and the smaller ones are still tried; steps above the
        largest captured bucket run eagerly. A forward the device refuses to record (it synchronises
        with the host, e.g. MoE routing) leaves graphs off with a warning. Returns whether graphs are on."""
        started = time.perf_counter()
        declined: list[str] = []
        for bucket in reversed(self.buckets):
            graph = self._new_graph()
            if graph.freezes_plan and not self.backend.capabilities.graph_capture:
                raise ValueError(f"attention backend {self.backend.name!r} does not declare graph_capture: a captured "
                                 f"graph would replay a stale attention plan (use enforce_eager)")
            self.buffers.pad(0, self.padding_slot)
            self._seq_lens_cpu = [1] * bucket
            try:
                graph.capture(lambda b=bucket: self._plan(b), lambda metadata, b=bucket: self._forward(b, metadata))
            except GraphCaptureDeclined as reason:
                self.graphs.clear()
                declined.append(f"batch size {bucket}: {reason}")
                continue
            except Exception as error:  # the device refused to record this forward; serve eagerly instead
                self.graphs.clear()
                logger.warning("decode graphs off: capturing batch size %d failed: %s", bucket, error)
                return False
            self.graphs[bucket] = graph
        if not self.graphs:
            logger.info("decode graphs off: %s", declined[-1])  # every bucket declined
            return False
        if declined:
            logger.info("decode graphs: larger batch sizes run eagerly (%s)", declined[-1])
        self.buckets = tuple(sorted(self.graphs))
        self.capture_seconds = time.perf_counter() - started
        kind = "captured" if self.graphs[self.buckets[-1]].freezes_plan else "prepared (eager)"
        logger.info("%s decode graphs for batch sizes %s in %.2f s", kind, list(self.buckets), self.capture_seconds)
        return True

    def accepts(self, step: StepInputs) -> bool:
        """Whether ``step`` is decode-only, without prompt logprobs, and fits the largest bucket."""
        batch = step.attention
        return (bool(self.graphs) and batch.max_query_len == 1 and batch.num_requests <= self.buckets[-1]
                and not step.prompt_logprob_spans)

    def run(self, step: StepInputs) -> torch.Tensor:
        """Hidden states [n, hidden] of an accepted step's ``n`` tokens, through its bucket's graph."""
        n = step.attention.num_requests
        bucket = self.bucket_for(n)
        self.buffers.load(step, self.padding_slot)
        self._seq_lens_cpu = [*step.attention.seq_lens_cpu, *([1] * (bucket - n))]
        return self.graphs[bucket].replay()[:n]

    def _plan(self, bucket: int) -> Any:
        return self.backend.plan(self.buffers.batch(bucket, self._seq_lens_cpu, self.block_size))


def decode_graph_factory(platform: Any, backend: type[AttentionBackend] | AttentionBackend,
                         enforce_eager: bool) -> tuple[Callable[[], DecodeGraph] | None, str]:
    """The platform's graph constructor when decode graphs can be used, else None; with the reason."""
    if enforce_eager:
        return None, "disabled by enforce_eager"
    if not platform.capabilities.graph_capture:
        return None, f"platform {platform.name} cannot capture graphs"
    if not backend.capabilities.graph_capture:
        return None, f"attention backend {backend.name} does not support graph capture"
    if getattr(type(platform), "create_graph", None) in (None, Platform.create_graph):
        return None, f"platform {platform.name} declares graph capture but offers no create_graph()"
    return platform.create_graph, f"captured per batch size on {platform.name} with attention backend {backend.name}"
