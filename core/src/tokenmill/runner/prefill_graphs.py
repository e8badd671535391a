"""PrefillGraphRunner: one request's prefill chunk replayed through a graph per padded length.

A short prompt's first token is latency a user waits on, and on a CPU a layer's Python (module
calls, shape checks, allocations, each run with caches a matrix product has just flushed) costs
as much as a quarter of its kernels. A step that feeds one request ``T`` tokens (``1 < T <=``
the platform's ``prefill_graph_max_tokens``) is therefore padded up to the smallest bucket
``B >= T`` (8, 16, ... 64, then 80, 96, ...: at most 8 and 20% padding) and replayed through
that bucket's graph.

The static buffers hold two requests: rows ``:T`` are the real one (its context length, block
table and slots as the step has them), rows ``T:B`` a padding request of ``B - T`` tokens at
position 0 whose keys and values all go to slot ``padding_slot`` of the null block, with a block
table of null blocks: it reads and writes only that block, and its rows are sliced off. A graph is
captured on a dummy split (``B - 2`` tokens and 2 of padding), so its frozen attention plan is one
the backend makes for any split (``AttentionCapabilities.prefill_graph_capture``). Every bucket
is captured while the engine starts, largest first (on platforms whose graphs share memory it sizes
that memory for the rest), so no request waits on a capture; a bucket whose capture is declined runs
eagerly. A server defers all but the largest (``capture(defer=True)``) and captures the others one at
a time while it has nothing to do (``capture_next``), so it answers sooner; until then those lengths
run eagerly. When the largest declines but the smallest captures (a kernel that leaves native code above
some number of tokens, like the GGUF CPU kernel's GEMM route for long prefills), a bisection finds
the largest bucket that captures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from tokenmill.plugin_api import AttentionBackend, AttentionBatch
from tokenmill.plugin_api.graphs import DecodeGraph, GraphCaptureDeclined
from tokenmill.runner.graph_runner import NULL_BLOCK_ID, BucketGraphRunner
from tokenmill.runner.step_inputs import StepInputs

logger = logging.getLogger("tokenmill")


class _RecordingRefused(RuntimeError):
    """A capture failed for another reason than a decline: no prefill graph is kept."""


PREFILL_BUCKET_STEP = 8  # the smallest bucket, and the step up to 64 tokens
_CAPTURE_PADDING = 2  # rows of padding in the dummy split a graph is captured on


def prefill_buckets(max_tokens: int) -> tuple[int, ...]:
    """Padded prefill lengths 8, 16, ... 64 and then every 16 up to ``max_tokens`` (rounded down)."""
    if max_tokens < PREFILL_BUCKET_STEP:
        raise ValueError(f"prefill graphs need chunks of at least {PREFILL_BUCKET_STEP} tokens, got {max_tokens}")
    sizes = [*range(PREFILL_BUCKET_STEP, 65, PREFILL_BUCKET_STEP), *range(80, max_tokens + 1, 16)]
    return tuple(size for size in sizes if size <= max_tokens)


class PrefillBuffers:
    """Static inputs of a padded single-request prefill: up to ``max_tokens`` rows, two requests."""

    def __init__(self, max_tokens: int, max_blocks_per_seq: int, device: torch.device) -> None:
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.query_start_loc = torch.zeros(3, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(2, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(2, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(2, max_blocks_per_seq, dtype=torch.int32, device=device)

    def load(self, step: StepInputs, bucket: int, padding_slot: int) -> None:
        """Copy a one-request prefill step into rows ``:T`` and make rows ``T:bucket`` padding."""
        batch = step.attention
        tokens, context = batch.num_tokens, batch.seq_lens_cpu[0] - batch.num_tokens
        self.input_ids[:tokens].copy_(step.input_ids)
        self.positions[:tokens].copy_(step.positions)
        self.slot_mapping[:tokens].copy_(batch.slot_mapping)
        width = batch.block_tables.shape[1]
        self.block_tables[0, :width].copy_(batch.block_tables[0])
        self.block_tables[0, width:].fill_(NULL_BLOCK_ID)
        self._split(tokens, context, bucket, padding_slot)

    def load_dummy(self, bucket: int, padding_slot: int) -> None:
        """A capture's split: ``bucket - 2`` tokens at context 0 and 2 of padding, all in the null block."""
        tokens = bucket - _CAPTURE_PADDING
        self.input_ids[:tokens].zero_()
        self.positions[:tokens].copy_(torch.arange(tokens))
        self.slot_mapping[:tokens].fill_(padding_slot)
        self.block_tables[0].fill_(NULL_BLOCK_ID)
        self._split(tokens, 0, bucket, padding_slot)

    def _split(self, tokens: int, context: int, bucket: int, padding_slot: int) -> None:
        self.input_ids[tokens:bucket].zero_()
        self.positions[tokens:bucket].zero_()
        self.slot_mapping[tokens:bucket].fill_(padding_slot)
        self.block_tables[1].fill_(NULL_BLOCK_ID)
        self.query_start_loc.copy_(torch.tensor([0, tokens, bucket], dtype=torch.int32))
        self.seq_lens.copy_(torch.tensor([context + tokens, bucket - tokens], dtype=torch.int32))
        self.context_lens.copy_(torch.tensor([context, 0], dtype=torch.int32))

    def batch(self, bucket: int, block_size: int) -> AttentionBatch:
        """The AttentionBatch of the buffers as they hold a step now, every tensor a view of them."""
        starts, lens = self.query_start_loc.tolist(), self.seq_lens.tolist()
        query_lens = [starts[1] - starts[0], starts[2] - starts[1]]
        return AttentionBatch.build(
            query_lens, [n - q for n, q in zip(lens, query_lens, strict=True)], self.block_tables, block_size,
            slot_mapping=self.slot_mapping[:bucket],
            length_tensors=(self.query_start_loc, self.seq_lens, self.context_lens))


class PrefillGraphRunner(BucketGraphRunner):
    """Pads one-request prefill chunks to a bucket and replays that bucket's graph; ``capture`` first."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, kv_caches: list[torch.Tensor], *,
                 max_tokens: int, max_blocks_per_seq: int, block_size: int, device: torch.device,
                 new_graph: Callable[[], DecodeGraph], padding_slot: int = NULL_BLOCK_ID) -> None:
        super().__init__(model, backend, kv_caches, buckets=prefill_buckets(max_tokens), block_size=block_size,
                         new_graph=new_graph, padding_slot=padding_slot)
        self.buffers = PrefillBuffers(self.buckets[-1], max_blocks_per_seq, device)
        self.declined: dict[int, str] = {}  # bucket -> why its capture was declined (it runs eagerly)
        self.pending: list[int] = []  # buckets left for capture_next(), largest first

    @torch.inference_mode()
    def capture(self, defer: bool = False) -> bool:
        """Capture every bucket, largest first (with ``defer``, only the largest that captures: the rest
        wait in ``pending`` for ``capture_next``); returns whether any graph was kept. Nothing is kept
        when the backend cannot replay a prefill plan, the smallest and the largest bucket both
        decline, or the device refuses to record (each logged). When only the largest declines (a
        kernel that leaves native code above some size), a bisection finds the largest bucket that
        captures and the buckets above it run eagerly, as does any smaller one that declines."""
        if not self.backend.capabilities.prefill_graph_capture:
            logger.info("prefill graphs off: attention backend %s cannot replay a prefill plan", self.backend.name)
            return False
        started = time.perf_counter()
        buckets = self.buckets
        try:
            top = len(buckets) - 1
            if not self._try_capture(buckets[top]):
                if top == 0 or not self._try_capture(buckets[0]):
                    logger.info("prefill graphs off: %d tokens: %s", buckets[-1], self.declined[buckets[-1]])
                    return False
                top = self._largest_capturing(0, top)
                for bucket in buckets[top + 1:]:
                    self.declined.setdefault(bucket, f"larger than {buckets[top]} tokens, the largest that captures")
        except _RecordingRefused as error:
            self._turn_off(error)
            return False
        self.pending = [b for b in reversed(buckets[:top + 1]) if b not in self.graphs and b not in self.declined]
        if defer:
            logger.info("captured the prefill graph for %d tokens in %.2f s; %d smaller ones follow while the "
                        "engine is idle", buckets[top], time.perf_counter() - started, len(self.pending))
            return True
        while self.pending:
            self._capture_pending()
        if not self.graphs:  # the device refused to record a smaller bucket
            return False
        logger.info("captured prefill graphs for one request's chunks of %s tokens in %.2f s", list(sorted(self.graphs)),
                    time.perf_counter() - started)
        return True

    @torch.inference_mode()
    def capture_next(self) -> bool:
        """Capture the largest pending bucket; returns whether any remain. A device that refuses to
        record drops every prefill graph (logged), as at start."""
        if not self.pending:
            return False
        self._capture_pending()
        if not self.pending and self.graphs:
            logger.info("captured prefill graphs for one request's chunks of %s tokens", list(sorted(self.graphs)))
        return bool(self.pending)

    def _capture_pending(self) -> None:
        """Capture the first pending bucket (a decline is logged; a refusal turns prefill graphs off)."""
        bucket = self.pending.pop(0)
        try:
            if not self._try_capture(bucket):
                logger.info("prefill graph for %d tokens declined, runs eagerly: %s", bucket, self.declined[bucket])
        except _RecordingRefused as error:
            self._turn_off(error)

    def _turn_off(self, error: Exception) -> None:
        self.graphs.clear()
        self.pending.clear()
        logger.warning("prefill graphs off: %s", error)

    def _largest_capturing(self, captured: int, declined: int) -> int:
        """The index of the largest bucket that captures between bucket indices ``captured`` (one that
        did) and ``declined`` (one that did not), by bisection."""
        while declined - captured > 1:
            middle = (captured + declined) // 2
            if self._try_capture(self.buckets[middle]):
                captured = middle
            else:
                declined = middle
        return captured

    def _try_capture(self, bucket: int) -> bool:
        """Capture ``bucket``'s graph; False (with the reason in ``declined``) when the capture is declined."""
        try:
            self.graphs[bucket] = self._capture(bucket)
        except GraphCaptureDeclined as reason:
            self.declined[bucket] = str(reason)
            return False
        except Exception as error:  # the device refused to record this forward
            raise _RecordingRefused(f"capturing {bucket} tokens failed: {error}") from error
        return True

    def accepts(self, step: StepInputs) -> bool:
        """Whether ``step`` prefills one request by 2 .. max tokens, without prompt logprobs, in a
        bucket that has a graph."""
        batch = step.attention
        return (batch.num_requests == 1 and 1 < batch.num_tokens <= self.buckets[-1] and not step.prompt_logprob_spans
                and self.bucket_for(batch.num_tokens) in self.graphs)

    @torch.inference_mode()
    def run(self, step: StepInputs) -> torch.Tensor:
        """Hidden states [T, hidden] of an accepted step's T tokens, through its bucket's graph."""
        bucket = self.bucket_for(step.attention.num_tokens)
        self.buffers.load(step, bucket, self.padding_slot)
        return self.graphs[bucket].replay()[: step.attention.num_tokens]

    def _capture(self, bucket: int) -> DecodeGraph:
        graph = self._new_graph()
        self.buffers.load_dummy(bucket, self.padding_slot)
        graph.capture(lambda: self.backend.plan(self.buffers.batch(bucket, self.block_size)),
                      lambda metadata: self._forward(bucket, metadata))
        return graph
