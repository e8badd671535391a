"""DraftModelProposer: draft tokens from a faster copy of the model, decoding greedily on the target's KV cache.

The draft shares the target's KV cache and block tables. Positions before a request's last token
hold the target's keys and values (verified tokens), so the draft attends to exactly what the
target computed; the draft writes its own keys and values for the tokens it feeds (the last token
and its drafts, from position ``num_tokens - 1`` on), and the next verifying step overwrites every
one of them with the target's. Requests decode together, one batched draft forward per draft
token, through the draft's own decode graphs where the platform captures them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext
from tokenmill.plugin_api import AttentionBackend
from tokenmill.runner.graph_runner import DecodeGraphRunner
from tokenmill.runner.step_inputs import StepInputBuilder
from tokenmill.sampling.greedy import GreedyArgmax
from tokenmill.scheduler.output import ScheduledRequest
from tokenmill.spec_decode.proposer import DraftSlot


class DraftModelProposer:
    """Runs ``num_speculative_tokens`` batched greedy decode steps of ``model`` per call."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, kv_caches: list[torch.Tensor], *,
                 num_speculative_tokens: int, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device, greedy: GreedyArgmax | None = None) -> None:
        self.model = model
        self.greedy = greedy if greedy is not None else GreedyArgmax()  # the target runner's, from the builder
        self.backend = backend
        self.kv_caches = kv_caches
        self.num_speculative_tokens = num_speculative_tokens
        self.inputs = StepInputBuilder(max_num_seqs, max_num_seqs, max_blocks_per_seq, block_size, device)
        self.graphs: DecodeGraphRunner | None = None  # set (and captured) by the engine builder

    @torch.inference_mode()
    def propose(self, slots: Sequence[DraftSlot]) -> dict[str, list[int]]:
        """Up to ``slot.num_tokens`` greedy draft tokens per request (all of them unless a request's
        limit is lower)."""
        drafts: dict[str, list[int]] = {slot.request.request_id: [] for slot in slots}
        fed = {slot.request.request_id: slot.request.all_token_ids[-1] for slot in slots}
        for index in range(self.num_speculative_tokens):
            live = [slot for slot in slots if slot.num_tokens > index]
            if not live:
                break
            scheduled = [ScheduledRequest(request=slot.request, token_ids=[fed[slot.request.request_id]],
                                          start_position=slot.request.num_tokens - 1 + index,
                                          block_ids=list(slot.block_ids), sample=True) for slot in live]
            step = self.inputs.build(scheduled)
            if self.graphs is not None and self.graphs.accepts(step):
                hidden = self.graphs.run(step)
            else:
                ctx = AttentionContext(backend=self.backend, metadata=self.backend.plan(step.attention),
                                       kv_caches=self.kv_caches)
                hidden = self.model(step.input_ids, step.positions, ctx)
            for slot, token_id in zip(live, self.greedy.token_ids(self.model, hidden).tolist(), strict=True):
                request_id = slot.request.request_id
                drafts[request_id].append(token_id)
                fed[request_id] = token_id
        return {request_id: tokens for request_id, tokens in drafts.items() if tokens}
