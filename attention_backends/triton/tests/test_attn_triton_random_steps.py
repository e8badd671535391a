"""Random mixed steps (hypothesis) against dense attention: any mix of prefills, chunks and decodes."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

requests = st.lists(
    st.tuples(st.integers(1, 12), st.integers(0, 70)),  # (query_len, context_len)
    min_size=1,
    max_size=4,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=requests,
    heads=st.sampled_from([(2, 2), (4, 2), (3, 1), (6, 3)]),
    head_size=st.sampled_from([16, 40, 64]),
    block_size=st.sampled_from([8, 16, 32]),
    sliding_window=st.one_of(st.none(), st.integers(1, 40)),
    logits_soft_cap=st.one_of(st.none(), st.floats(0.5, 20.0)),
    seed=st.integers(0, 2**16),
)
def test_random_step(
    paged_case, triton_step, close, requests, heads, head_size, block_size, sliding_window, logits_soft_cap, seed
):
    query_lens, context_lens = (list(x) for x in zip(*requests, strict=True))
    case = paged_case(
        query_lens,
        context_lens,
        num_heads=heads[0],
        num_kv_heads=heads[1],
        head_size=head_size,
        block_size=block_size,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        seed=seed,
    )
    expected_cache = case.expected_cache()
    close(triton_step(case), case.expected(), torch.float32)
    assert torch.equal(case.kv_cache.cpu(), expected_cache.cpu())
