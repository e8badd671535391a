"""AttentionBatch.build: every field of a step's batch derived from the per-request facts."""

from __future__ import annotations

import pytest
import torch

from tokenmill.plugin_api import AttentionBatch


def test_fields_follow_from_query_and_context_lengths_and_ragged_tables():
    batch = AttentionBatch.build([3, 1, 2], [0, 5, 4], [[7], [2, 9], [4, 6]], block_size=4)
    assert batch.query_start_loc.tolist() == [0, 3, 4, 6]
    assert batch.seq_lens.tolist() == batch.seq_lens_cpu == [3, 6, 6]
    assert batch.context_lens.tolist() == [0, 5, 4]
    assert batch.block_tables.tolist() == [[7, 0], [2, 9], [4, 6]]  # padded with the null block
    assert batch.slot_mapping.tolist() == [28, 29, 30, 37, 24, 25]  # block * 4 + offset at each new position
    assert batch.query_lens_cpu == [3, 1, 2] and batch.max_query_len == 3 and batch.max_seq_len == 6
    assert batch.num_tokens == 6 and batch.num_requests == 3 and not batch.is_pure_decode
    assert [t.dtype for t in (batch.query_start_loc, batch.seq_lens, batch.context_lens, batch.block_tables)] == \
        [torch.int32] * 4 and batch.slot_mapping.dtype == torch.int64


def test_given_tensors_are_used_as_they_are():
    tables = torch.tensor([[3, 0], [5, 8]], dtype=torch.int32)
    slots = torch.tensor([12, 20, 21, 2, 2], dtype=torch.int64)  # the tail pads past num_tokens
    lengths = (torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([1, 6], dtype=torch.int32),
               torch.tensor([0, 4], dtype=torch.int32))
    batch = AttentionBatch.build([1, 2], [0, 4], tables, 4, slot_mapping=slots, length_tensors=lengths)
    assert batch.block_tables is tables and batch.slot_mapping is slots
    assert (batch.query_start_loc, batch.seq_lens, batch.context_lens) == lengths
    assert batch.num_tokens == 3 and batch.is_pure_decode is False


def test_host_arrays_and_mismatched_lengths():
    import numpy as np

    batch = AttentionBatch.build(np.array([1, 1]), np.array([2, 0]), np.array([[1], [2]], dtype=np.int32), 4)
    assert batch.is_pure_decode and batch.slot_mapping.tolist() == [6, 8] and batch.query_lens_cpu == [1, 1]
    with pytest.raises(ValueError, match="2 query lengths but 1 context lengths"):
        AttentionBatch.build([1, 1], [0], [[1], [2]], 4)
