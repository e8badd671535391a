"""Speculative decoding in the scheduler: draft tokens fed and verified, lookahead slots, the K/V of
rejected drafts forgotten, limits (max_tokens, max_model_len, stop tokens) kept exactly."""

from collections import defaultdict

import pytest

from tokenmill.request import Request, RequestStatus
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig
from tokenmill.spec_decode.verification import accept_greedy, can_speculate

BLOCK = 4
GARBAGE = -7  # what the fake drafter writes into the slots of the tokens it feeds


def next_token(sequence: list[int]) -> int:
    return sum((i + 1) * t for i, t in enumerate(sequence)) % 89 + 10


class Model:
    """Plays the runner and the drafter on a shared slot store: the target reads every context token
    back from the slots, so any draft K/V left unverified would change its output."""

    def __init__(self) -> None:
        self.slots: dict[int, dict[int, int]] = defaultdict(dict)
        self.drafted = 0

    def read(self, block_ids, length):
        return [self.slots[block_ids[p // BLOCK]].get(p % BLOCK) for p in range(length)]

    def execute(self, output):
        sampled = {}
        for s in output.scheduled:
            for p, token in enumerate(s.token_ids, start=s.start_position):
                self.slots[s.block_ids[p // BLOCK]][p % BLOCK] = token
            if not s.sample:
                continue
            end = s.start_position + s.num_tokens
            first = end - s.num_spec_tokens - 1
            targets = [next_token(self.read(s.block_ids, p + 1)) for p in range(first, end)]
            drafts = s.token_ids[len(s.token_ids) - s.num_spec_tokens:]
            sampled[s.request_id] = accept_greedy(drafts, targets)
        return sampled

    def draft(self, request: Request, block_ids, count: int) -> list[int]:
        """The true continuation, except that every third proposal is wrong; writes garbage K/V."""
        sequence = list(request.all_token_ids)
        drafts = []
        for index in range(count):
            position = request.num_tokens - 1 + index
            assert position < len(block_ids) * BLOCK, "drafted past the slots the scheduler reserved"
            self.slots[block_ids[position // BLOCK]][position % BLOCK] = GARBAGE
            token = next_token(sequence)
            self.drafted += 1
            if self.drafted % 3 == 0:
                token = token % 89 + 11
            drafts.append(token)
            sequence.append(token)
        return drafts


def generate(requests: list[Request], num_spec: int, **config) -> tuple[dict[str, list[int]], Scheduler]:
    settings = dict(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=64, block_size=BLOCK, num_blocks=96,
                    num_lookahead_tokens=num_spec)
    settings.update(config)
    scheduler = Scheduler(SchedulerConfig(**settings))
    model = Model()
    for request in requests:
        scheduler.add_request(request)
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        for s in output.scheduled:
            assert s.num_spec_tokens == 0 or s.num_tokens == s.num_spec_tokens + 1
        for update in scheduler.update(output, model.execute(output)):
            budget = scheduler.draft_budget(update.request, num_spec) if num_spec and not update.finished else 0
            if budget:
                block_ids = scheduler.kv_cache_manager.get_block_ids(update.request_id)
                update.request.spec_token_ids = model.draft(update.request, block_ids, budget)
    return {r.request_id: r.output_token_ids for r in requests}, scheduler


def make_requests(**params) -> list[Request]:
    settings = dict(temperature=0.0, max_tokens=23)
    settings.update(params)
    return [Request(f"r{i}", range(20 + i, 20 + i + length), SamplingParams(**settings), eos_token_ids=(5,))
            for i, length in enumerate((3, 9, 14, 1))]


@pytest.mark.parametrize("num_spec", [1, 3, 6])
def test_outputs_equal_plain_decoding_with_rejections(num_spec):
    plain, _ = generate(make_requests(), 0)
    speculated, scheduler = generate(make_requests(), num_spec)
    assert speculated == plain and all(len(tokens) == 23 for tokens in plain.values())
    stats = scheduler.stats()
    assert stats.spec_num_drafts > 0 and 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert stats.spec_acceptance_rate == stats.spec_num_accepted_tokens / stats.spec_num_draft_tokens
    assert scheduler.kv_cache_manager.block_pool.num_free_blocks == 95  # every block back


def test_prefix_cache_keeps_only_verified_blocks():
    first, scheduler = generate(make_requests(), 3, enable_prefix_caching=True)
    # a second run reads the first one's cached blocks: wrong hashes or draft K/V would change its tokens
    again, _ = generate(make_requests(), 3, enable_prefix_caching=True)
    assert first == again == generate(make_requests(), 0, enable_prefix_caching=False)[0]


def test_stop_token_among_accepted_drafts_ends_the_request_there():
    plain, _ = generate(make_requests(max_tokens=30), 0)
    stop = plain["r1"][11]
    stopped_plain, _ = generate(make_requests(max_tokens=30, stop_token_ids=[stop]), 0)
    stopped, scheduler = generate(make_requests(max_tokens=30, stop_token_ids=[stop]), 5)
    assert stopped == stopped_plain and stopped["r1"][-1] == stop and len(stopped["r1"]) <= 12


def test_max_model_len_and_max_tokens_hold_exactly():
    limited, _ = generate(make_requests(max_tokens=None), 0, max_model_len=40)
    speculated, _ = generate(make_requests(max_tokens=None), 6, max_model_len=40)
    assert speculated == limited
    assert all(r.num_prompt_tokens + len(limited[r.request_id]) == 40 for r in make_requests(max_tokens=None))


def test_a_small_budget_cuts_the_drafts():
    speculated, scheduler = generate(make_requests(), 6, max_num_batched_tokens=3, long_prefill_token_threshold=0)
    assert speculated == generate(make_requests(), 0, max_num_batched_tokens=3)[0]


def test_preempted_requests_drop_their_drafts_and_recompute():
    plain, _ = generate(make_requests(max_tokens=30), 0, num_blocks=20)
    speculated, scheduler = generate(make_requests(max_tokens=30), 4, num_blocks=20)
    assert speculated == plain and scheduler.num_preemptions > 0


def test_lookahead_slots_are_reserved_after_a_sampling_chunk():
    scheduler = Scheduler(SchedulerConfig(block_size=BLOCK, num_blocks=32, num_lookahead_tokens=5))
    request = Request("a", range(10, 16), SamplingParams(temperature=0.0, max_tokens=8))
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert output.scheduled[0].num_tokens == 6 and output.scheduled[0].num_spec_tokens == 0
    assert len(scheduler.kv_cache_manager.get_block_ids("a")) == 3  # 6 tokens + 5 lookahead slots
    scheduler.update(output, {"a": [40]})
    assert scheduler.draft_budget(request, 5) == 5
    request.spec_token_ids = [41, 42, 43, 44, 45]
    scheduled = scheduler.schedule().scheduled[0]
    assert scheduled.token_ids == [40, 41, 42, 43, 44, 45] and scheduled.start_position == 6
    assert scheduled.num_spec_tokens == 5 and scheduled.sample


def test_only_plain_greedy_requests_speculate():
    def request(**params):
        return Request("x", [1, 2, 3], SamplingParams(**params))

    assert can_speculate(request(temperature=0.0))
    for params in (dict(temperature=0.7), dict(temperature=0.0, logprobs=2), dict(temperature=0.0, repetition_penalty=1.2),
                   dict(temperature=0.0, logit_bias={3: 1.0}), dict(temperature=0.0, allowed_token_ids=[1, 2]),
                   dict(temperature=0.0, bad_words_token_ids=[[4]]), dict(temperature=0.0, min_tokens=3)):
        assert not can_speculate(request(**params)), params
    scheduler = Scheduler(SchedulerConfig(block_size=BLOCK, num_blocks=32, num_lookahead_tokens=3))
    sampled = Request("s", [1, 2, 3], SamplingParams(temperature=0.8, max_tokens=9))
    scheduler.add_request(sampled)
    scheduler.update(scheduler.schedule(), {"s": [7]})
    assert sampled.status == RequestStatus.RUNNING and scheduler.draft_budget(sampled, 3) == 0


def test_accept_greedy_keeps_the_targets_up_to_the_first_mismatch():
    assert accept_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert accept_greedy([5, 9, 7], [5, 6, 7, 8]) == [5, 6]
    assert accept_greedy([9], [5, 6]) == [5]
    assert accept_greedy([], [4]) == [4]
    with pytest.raises(ValueError, match="need 3 target tokens"):
        accept_greedy([1, 2], [1, 2])
