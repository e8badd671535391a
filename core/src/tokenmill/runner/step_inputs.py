"""StepInputs: one scheduler step flattened into the tensors the model and attention backend read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenmill.plugin_api import AttentionBatch
from tokenmill.scheduler.output import ScheduledRequest


@dataclass
class StepInputs:
    """Flat token batch of one step.

    ``sample_rows[i]`` is the row of the flat batch whose logits choose the next token of
    ``sample_requests[i]``; ``prompt_logprob_spans`` maps a request to the rows of its fed tokens
    when it asked for prompt logprobs. ``verify_rows`` holds, request after request of
    ``verify_requests``, the rows whose argmax checks each draft token (the rows of the tokens fed
    before each draft; the row of the last draft is the request's ``sample_rows`` entry).
    ``pooling_chunks`` lists each pooling request's chunk with its rows ``[start, end)``: such a
    request never samples, its hidden states are pooled.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionBatch
    sample_rows: torch.Tensor
    sample_requests: list[ScheduledRequest]
    prompt_logprob_spans: dict[str, tuple[int, int]]
    verify_rows: torch.Tensor | None = None
    verify_requests: tuple[ScheduledRequest, ...] = ()
    pooling_chunks: tuple[tuple[ScheduledRequest, int, int], ...] = ()


class StepInputBuilder:
    """Builds StepInputs into persistent host buffers, then copies them to the device once."""

    def __init__(self, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self.max_blocks_per_seq = max_blocks_per_seq
        self._token_ids = np.zeros(max_num_tokens, dtype=np.int64)
        self._positions = np.zeros(max_num_tokens, dtype=np.int64)
        self._block_tables = np.zeros((max_num_seqs, max_blocks_per_seq), dtype=np.int32)

    def build(self, scheduled: list[ScheduledRequest]) -> StepInputs:
        num_reqs = len(scheduled)
        query_lens = np.fromiter((s.num_tokens for s in scheduled), dtype=np.int64, count=num_reqs)
        starts = np.fromiter((s.start_position for s in scheduled), dtype=np.int64, count=num_reqs)
        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])

        token_ids = self._token_ids[:num_tokens]
        token_ids[:] = np.fromiter((t for s in scheduled for t in s.token_ids), dtype=np.int64, count=num_tokens)
        # positions: start of each request plus the offset of the token inside its chunk
        request_of_token = np.repeat(np.arange(num_reqs), query_lens)
        positions = self._positions[:num_tokens]
        positions[:] = np.arange(num_tokens) - query_start_loc[request_of_token] + starts[request_of_token]

        max_blocks = max((len(s.block_ids) for s in scheduled), default=0)
        block_tables = self._block_tables[:num_reqs, :max_blocks]
        block_tables.fill(0)
        for row, s in enumerate(scheduled):
            block_tables[row, : len(s.block_ids)] = s.block_ids
        block_index = positions // self.block_size
        slot_mapping = block_tables[request_of_token, block_index].astype(np.int64) * self.block_size
        slot_mapping += positions % self.block_size

        sampling = [i for i, s in enumerate(scheduled) if s.sample and s.request.pooling is None]
        sample_requests = [scheduled[i] for i in sampling]
        sample_rows = np.fromiter((query_start_loc[i + 1] - 1 for i in sampling), dtype=np.int64, count=len(sampling))
        pooling_chunks = tuple((s, int(query_start_loc[i]), int(query_start_loc[i + 1]))
                               for i, s in enumerate(scheduled) if s.request.pooling is not None)
        verify_requests = tuple(s for s in scheduled if s.sample and s.num_spec_tokens)
        verify_rows = None
        if verify_requests:
            ends = [query_start_loc[i + 1] - 1 for i, s in enumerate(scheduled) if s.sample and s.num_spec_tokens]
            verify_rows = np.concatenate([np.arange(end - s.num_spec_tokens, end)
                                          for end, s in zip(ends, verify_requests, strict=True)])
        prompt_logprob_spans = {
            s.request_id: (int(query_start_loc[i]), int(query_start_loc[i + 1]))
            for i, s in enumerate(scheduled)
            if s.request.sampling_params.prompt_logprobs is not None and s.start_position < s.request.num_prompt_tokens
            and not s.request.output_token_ids  # a preempted request recomputes its prompt: logprobs were sent
        }

        def to_device(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device=self.device, dtype=dtype)

        attention = AttentionBatch.build(query_lens, starts, block_tables, self.block_size,
                                         slot_mapping=slot_mapping, device=self.device)
        return StepInputs(
            input_ids=to_device(token_ids, torch.int64),
            positions=to_device(positions, torch.int64),
            attention=attention,
            sample_rows=to_device(sample_rows, torch.int64),
            sample_requests=sample_requests,
            prompt_logprob_spans=prompt_logprob_spans,
            verify_rows=None if verify_rows is None else to_device(verify_rows, torch.int64),
            verify_requests=verify_requests,
            pooling_chunks=pooling_chunks,
        )
