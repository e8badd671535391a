"""ModelRunner: runs one scheduled step on the model, hardware-neutrally.

Per step: flatten the scheduled requests (StepInputs), let the attention backend plan once, run
the model, take the logits of the rows that sample, and sample (or, for greedy batches, ask the
model for the argmax directly); pooling requests' rows are pooled instead
(``PooledStates``). Requests that fed draft tokens get the target's argmax at every
draft and keep the tokens up to the first mismatch (``accept_greedy``); ``propose`` asks the
speculative-decoding proposer, if any, for the next drafts. The runner knows the platform only
through its device, the attention backend and the layer kernels it was given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext
from tokenmill.plugin_api import AttentionBackend, AttentionSpec, LayerKernels, Platform
from tokenmill.runner.graph_runner import DecodeGraphRunner
from tokenmill.runner.kv_cache_pages import IDLE_CHUNK_BYTES, STARTUP_BYTES, KvCachePages
from tokenmill.runner.pooled_states import PooledStates
from tokenmill.runner.prefill_graphs import PrefillGraphRunner
from tokenmill.runner.step_inputs import StepInputBuilder, StepInputs
from tokenmill.sampling.batch import SamplingBatch
from tokenmill.sampling.greedy import GreedyArgmax
from tokenmill.sampling.logprobs import prompt_logprobs_for_chunk
from tokenmill.sampling.sampler import Sampler, SamplerOutput
from tokenmill.scheduler.output import SchedulerOutput
from tokenmill.spec_decode.proposer import DraftSlot, Proposer
from tokenmill.spec_decode.verification import accept_greedy
from tokenmill.wire import LogprobsEntry

logger = logging.getLogger(__name__)


@dataclass
class RunnerOutput:
    """Sampled tokens (and logprobs when asked) of one step, by request id, and the pooled float32
    vectors of the pooling requests whose prompt the step finished."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    pooled: dict[str, torch.Tensor] = field(default_factory=dict)
    logprobs: dict[str, list[LogprobsEntry]] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[LogprobsEntry | None]] = field(default_factory=dict)


def kv_cache_bytes_per_block(specs: list[AttentionSpec], block_size: int, element_size: int) -> int:
    """Bytes one block occupies across all layers (keys and values)."""
    return sum(2 * block_size * s.num_kv_heads * s.head_size * element_size for s in specs)


def _block_dim(backend: AttentionBackend, block_size: int, specs: list[AttentionSpec]) -> int:
    """The dimension of the backend's cache shape that counts blocks (default layout: 1)."""
    if not specs:
        return 0
    spec = specs[0]
    one, two = (backend.kv_cache_shape(n, block_size, spec.num_kv_heads, spec.head_size) for n in (1, 2))
    return next((d for d, (a, b) in enumerate(zip(one, two, strict=True)) if a != b), 0)


class ModelRunner:
    """Holds the loaded model, the KV caches and the sampler; ``execute`` runs one step."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, *, num_blocks: int, block_size: int,
                 max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, vocab_size: int,
                 device: torch.device, layer_kernels: LayerKernels | None = None,
                 platform: Platform | None = None) -> None:
        """``platform`` allocates the KV caches and backs their pages (``Platform.allocate_kv_cache`` /
        ``back_kv_cache``); without one they are ``torch.zeros`` on ``device``, backed on first write."""
        self.model = model
        self.backend = backend
        self.device = device
        self.vocab_size = vocab_size
        self.specs: list[AttentionSpec] = model.attention_specs()
        shapes = [(backend.kv_cache_shape(num_blocks, block_size, s.num_kv_heads, s.head_size),
                   backend.kv_cache_torch_dtype(s)) for s in self.specs]
        if platform is not None:
            self.kv_caches = [platform.allocate_kv_cache(shape, dtype) for shape, dtype in shapes]
        else:
            self.kv_caches = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in shapes]
        self.kv_pages = KvCachePages(self.kv_caches, _block_dim(backend, block_size, self.specs), num_blocks,
                                     platform.back_kv_cache if platform is not None else None)
        max_blocks_per_seq = -(-max_model_len // block_size)
        self.inputs = StepInputBuilder(max_num_batched_tokens, max_num_seqs, max_blocks_per_seq, block_size, device)
        self.greedy = GreedyArgmax(layer_kernels)  # every greedy token id of the runner, sampler and drafter
        self.sampler = Sampler(self.greedy)
        self.pooled = PooledStates()
        # an encoder attends bidirectionally over whole prompts, with no KV cache: its steps run
        # ``embed_hidden`` on the flat batch (the scheduler never splits its prompts)
        self.is_encoder = model.is_encoder
        self.decode_graphs: DecodeGraphRunner | None = None  # set (and captured) by the engine builder
        self.prefill_graphs: PrefillGraphRunner | None = None  # likewise
        self.proposer: Proposer | None = None  # speculative decoding's drafter, set by the engine builder

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        """Run the model on the step and sample for every request whose chunk ends its known tokens."""
        if scheduler_output.finished_request_ids:
            self.sampler.release(scheduler_output.finished_request_ids)
            self.pooled.release(scheduler_output.finished_request_ids)
        result = RunnerOutput()
        if scheduler_output.is_empty:
            return result
        step = self.inputs.build(scheduler_output.scheduled)
        hidden = self._hidden(step)
        for scheduled, start, end in step.pooling_chunks:
            vector = self.pooled.add(scheduled, hidden[start:end])
            if vector is not None:
                result.pooled[scheduled.request_id] = vector.cpu()

        for scheduled in scheduler_output.scheduled:
            span = step.prompt_logprob_spans.get(scheduled.request_id)
            if span is not None:
                request = scheduled.request
                logits = self.model.compute_logits(hidden[span[0]: span[1]])
                result.prompt_logprobs[request.request_id] = prompt_logprobs_for_chunk(
                    logits, request.prompt_token_ids, scheduled.start_position,
                    request.sampling_params.prompt_logprobs)

        if step.sample_requests:
            rows = hidden.index_select(0, step.sample_rows)
            requests = [s.request for s in step.sample_requests]
            batch = SamplingBatch.from_requests(requests, self.vocab_size, self.device)
            sampled = self._greedy(rows, batch) or self.sampler(self.model.compute_logits(rows), batch)
            for request, token_id, logprobs in zip(requests, sampled.token_ids, sampled.logprobs, strict=True):
                result.sampled_token_ids[request.request_id] = [token_id]
                if logprobs is not None:
                    result.logprobs[request.request_id] = [logprobs]
        if step.verify_requests:
            self._verify(hidden, step, result)
        return result

    def _verify(self, hidden: torch.Tensor, step: StepInputs, result: RunnerOutput) -> None:
        """Replace each speculating request's single token (the target's choice after its last draft)
        by the tokens ``accept_greedy`` keeps from its drafts."""
        targets = self.greedy.token_ids(self.model, hidden.index_select(0, step.verify_rows)).tolist()
        start = 0
        for scheduled in step.verify_requests:
            count = scheduled.num_spec_tokens
            request_id = scheduled.request_id
            drafts = scheduled.token_ids[-count:]
            result.sampled_token_ids[request_id] = accept_greedy(
                drafts, [*targets[start: start + count], *result.sampled_token_ids[request_id]])
            start += count

    def propose(self, slots: list[DraftSlot]) -> dict[str, list[int]]:
        """Draft tokens for the next step from the proposer (none without one)."""
        if self.proposer is None or not slots:
            return {}
        return self.proposer.propose(slots)

    def _greedy(self, rows: torch.Tensor, batch: SamplingBatch) -> SamplerOutput | None:
        """The tokens of a batch that only takes argmaxes (all greedy, no logprobs, no logits processors)
        from the LM head's greedy shortcut (``GreedyArgmax.from_head``); None when it does not answer."""
        if not batch.all_greedy or batch.needs_processing or any(k is not None for k in batch.num_logprobs):
            return None
        token_ids = self.greedy.from_head(self.model, rows)
        if token_ids is None:
            return None
        return SamplerOutput(token_ids=token_ids.tolist(), logprobs=[None] * batch.num_rows)

    @torch.inference_mode()
    def prepare_greedy_head(self, hidden_size: int, dtype: torch.dtype) -> None:
        """Let the platform derive what it needs from the LM head before the first request
        (``GreedyArgmax.prepare``)."""
        self.greedy.prepare(self.model, hidden_size, dtype, self.device)

    def _hidden(self, step: StepInputs) -> torch.Tensor:
        """The step's hidden states [T, hidden]: an encoder's ``embed_hidden``, else a graph's replay, else
        the model's forward with the attention backend's plan."""
        if self.is_encoder:
            return self.model.embed_hidden(step.input_ids, step.positions, step.attention.query_lens_cpu)
        hidden = self._replay(step)
        if hidden is None:
            metadata = self.backend.plan(step.attention)
            ctx = AttentionContext(backend=self.backend, metadata=metadata, kv_caches=self.kv_caches)
            hidden = self.model(step.input_ids, step.positions, ctx)
        return hidden

    def _replay(self, step: StepInputs) -> torch.Tensor | None:
        """The step's hidden states through a decode or prefill graph, or None to run it eagerly."""
        if self.decode_graphs is not None and self.decode_graphs.accepts(step):
            return self.decode_graphs.run(step)
        if self.prefill_graphs is not None and self.prefill_graphs.accepts(step):
            return self.prefill_graphs.run(step)
        return None

    def capture_next_graph(self) -> bool:
        """Capture one graph left for idle time (see ``PrefillGraphRunner.capture_next``); returns
        whether more remain."""
        return self.prefill_graphs is not None and self.prefill_graphs.capture_next()

    def back_kv_cache(self, num_bytes: int = STARTUP_BYTES) -> None:
        """Back the first ``num_bytes`` of KV cache blocks now (``KvCachePages``), logging the time taken."""
        if backed := self.kv_pages.back(num_bytes):
            logger.info("backed the first %d MiB of the KV cache in %.2f s", backed >> 20, self.kv_pages.seconds)

    def work_while_idle(self) -> bool:
        """One short piece of deferred work: a graph left for idle time, else the next KV cache
        pages (``KvCachePages``); returns whether more remains."""
        if self.capture_next_graph():
            return True
        if self.kv_pages.done:
            return False
        if self.kv_pages.back(IDLE_CHUNK_BYTES) and self.kv_pages.done:
            logger.info("backed the whole KV cache (%.1f GiB) while idle, in %.1f s of idle time",
                        self.kv_cache_usage_bytes() / (1 << 30), self.kv_pages.seconds)
        return not self.kv_pages.done

    def kv_cache_usage_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.kv_caches)

    def shutdown(self) -> None:
        self.kv_caches.clear()

    def describe(self) -> dict[str, Any]:
        return {"layers": len(self.specs), "kv_cache_bytes": self.kv_cache_usage_bytes()}
