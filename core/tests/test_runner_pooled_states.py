"""PooledStates: a pooling request's hidden states pooled chunk by chunk equal pooling them at once."""

from __future__ import annotations

import pytest
import torch

from tokenmill.layers.pooling import PoolingConfig, pool
from tokenmill.request import Request
from tokenmill.runner.pooled_states import PooledStates
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.output import ScheduledRequest


@pytest.mark.parametrize("method", ["mean", "cls", "last"])
@pytest.mark.parametrize("normalize", [True, False])
def test_chunks_pool_like_the_whole_prompt(method, normalize):
    config = PoolingConfig(method=method, normalize=normalize)
    hidden = torch.randn(11, 6, generator=torch.Generator().manual_seed(0))
    request = Request("p", list(range(11)), SamplingParams(max_tokens=1), pooling=config)
    states = PooledStates()
    got = None
    for start, end in ((0, 4), (4, 9), (9, 11)):
        chunk = ScheduledRequest(request, list(range(start, end)), start, [1, 2, 3], sample=end == 11)
        output_buffer = hidden[start:end].clone()
        got = states.add(chunk, output_buffer)
        output_buffer.fill_(123.0)  # a graph's output buffer, written again by the next step
        assert (got is None) == (end < 11)
    torch.testing.assert_close(got, pool(hidden, [11], config)[0], atol=1e-6, rtol=0)


def test_release_forgets_a_request_cut_short():
    request = Request("p", [1, 2, 3], SamplingParams(max_tokens=1), pooling=PoolingConfig(method="mean"))
    states = PooledStates()
    states.add(ScheduledRequest(request, [1, 2], 0, [1], sample=False), torch.ones(2, 4))
    states.release(["p"])
    whole = states.add(ScheduledRequest(request, [1, 2, 3], 0, [1], sample=True), torch.zeros(3, 4))
    assert whole.tolist() == [0.0] * 4  # nothing left of the released chunk


def test_a_preempted_request_starts_over():
    config = PoolingConfig(method="mean", normalize=False)
    request = Request("p", [1, 2, 3, 4], SamplingParams(max_tokens=1), pooling=config)
    states = PooledStates()
    states.add(ScheduledRequest(request, [1, 2], 0, [1], sample=False), torch.full((2, 4), 9.0))
    states.add(ScheduledRequest(request, [1, 2], 0, [1], sample=False), torch.ones(2, 4))  # recomputed from 0
    whole = states.add(ScheduledRequest(request, [3, 4], 2, [1], sample=True), torch.ones(2, 4))
    assert whole.tolist() == [1.0] * 4
