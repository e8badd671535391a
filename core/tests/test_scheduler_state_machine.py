"""Property-based test: random add / fork / step / abort / finish / reset sequences against the scheduler.

A simulated runner writes (salt, token) into every KV slot it is told to fill and checks, before each
step, that every position before the chunk holds exactly the request's token under the request's
salt: prefix hits, forks and recompute after preemption must all hand out correct K/V.
"""

from collections import Counter, defaultdict

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tokenmill.request import Request, RequestStatus
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

EOS = 0
STOP_TOKEN = 5
MAX_MODEL_LEN = 24
BASES = [list(range(100 + 50 * i, 100 + 50 * i + MAX_MODEL_LEN)) for i in range(3)]
MAX_LIVE = 8
DRAIN_STEPS = 3000


@st.composite
def scheduler_configs(draw) -> SchedulerConfig:
    chunked = draw(st.booleans())
    block_size = draw(st.sampled_from([1, 2, 4]))
    return SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=draw(st.integers(1, 24)),
        max_model_len=MAX_MODEL_LEN,
        block_size=block_size,
        num_blocks=draw(st.integers(12 // block_size, 48 // block_size)),  # from "most requests preempt" to "ample"
        enable_prefix_caching=draw(st.booleans()),
        enable_chunked_prefill=chunked,
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 3, 7])) if chunked else 0,
    )


def kv_tokens_needed(num_prompt: int, max_tokens: int | None) -> int:
    """Most tokens whose K/V a request ever holds: everything but its last sampled token."""
    final = max(MAX_MODEL_LEN, num_prompt + 1)
    if max_tokens is not None:
        final = min(final, num_prompt + max_tokens)
    return final - 1


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(config=scheduler_configs())
    def setup(self, config: SchedulerConfig) -> None:
        self.config = config
        self.scheduler = Scheduler(config)
        self.kv = self.scheduler.kv_cache_manager
        self.slots: dict[int, dict[int, tuple]] = defaultdict(dict)
        self.requests: dict[str, Request] = {}
        self.expected_tokens: dict[str, list[int]] = {}
        self.unreported_finished: set[str] = set()
        self.claims: dict[bytes, list[tuple]] = {}  # block hash -> the (salt, token) slots it stands for
        self.next_id = 0

    # ---- rules -------------------------------------------------------------------------------

    @precondition(lambda self: len(self.scheduler.requests) < MAX_LIVE)
    @rule(
        copies=st.integers(1, 3),
        base=st.integers(0, len(BASES) - 1),
        length=st.integers(1, MAX_MODEL_LEN),
        suffix=st.lists(st.integers(20, 30), max_size=3),
        max_tokens=st.one_of(st.none(), st.integers(1, 10)),
        min_tokens=st.integers(0, 2),
        salt=st.sampled_from([None, "tenant"]),
        priority=st.integers(0, 2),
        ignore_eos=st.booleans(),
        stop_token=st.booleans(),
    )
    def add(self, copies, base, length, suffix, max_tokens, min_tokens, salt, priority, ignore_eos, stop_token) -> None:
        prompt = (BASES[base][:length] + suffix)[:MAX_MODEL_LEN]
        min_tokens = min(min_tokens, max_tokens or min_tokens)
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            stop_token_ids=[STOP_TOKEN] if stop_token else [],
        )
        for _ in range(copies):
            self._add(Request(self._new_id(), prompt, params, (EOS,), priority=priority, cache_salt=salt))

    @precondition(lambda self: len(self.scheduler.requests) < MAX_LIVE)
    @rule(data=st.data())
    def fork(self, data) -> None:
        live = sorted(self.scheduler.requests)
        if not live:
            return
        parent = self.scheduler.requests[data.draw(st.sampled_from(live))]
        child = Request(
            self._new_id(),
            parent.prompt_token_ids,
            parent.sampling_params,
            (EOS,),
            priority=parent.priority,
            cache_salt=parent.cache_salt,
        )
        self._add(child, fork_of=parent.request_id)

    @rule(data=st.data(), num_steps=st.integers(1, 4))
    def step(self, data, num_steps) -> None:
        for _ in range(num_steps):
            self._step(lambda n: data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)))

    @rule(data=st.data())
    def abort(self, data) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.requests) + ["unknown"]))
        was_live = request_id in self.scheduler.requests
        aborted = self.scheduler.abort_requests([request_id])
        assert [r.request_id for r in aborted] == ([request_id] if was_live else [])
        if was_live:
            assert self.requests[request_id].finish_reason == "abort"
            self.unreported_finished.add(request_id)

    @rule(data=st.data())
    def finish_with_stop_string(self, data) -> None:
        live = sorted(self.scheduler.requests)
        if not live:
            return
        request_id = data.draw(st.sampled_from(live))
        (finished,) = self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_STOPPED, "STOP")
        assert finished.finish_reason == "stop" and finished.stop_reason == "STOP"
        self.unreported_finished.add(request_id)

    @rule()
    def reset_prefix_cache(self) -> None:
        self.scheduler.reset_prefix_cache()
        assert self.kv.block_pool.cached_blocks == {}

    # ---- invariants --------------------------------------------------------------------------

    @invariant()
    def blocks_are_accounted_for(self) -> None:
        pool = self.kv.block_pool
        holders = Counter(id(block) for table in self.kv.req_to_blocks.values() for block in table)
        in_use = 0
        for block in pool.blocks[1:]:
            assert block.ref_cnt == holders[id(block)], block
            in_use += block.ref_cnt > 0
        assert pool.null_block.ref_cnt == 0 and holders[id(pool.null_block)] == 0
        free = list(pool.free_queue)
        assert len(free) == pool.num_free_blocks == len({id(b) for b in free})
        assert all(b.ref_cnt == 0 for b in free)
        assert pool.num_free_blocks + in_use == pool.num_usable_blocks
        for request_id, table in self.kv.req_to_blocks.items():
            assert self.kv.get_block_ids(request_id) == [b.block_id for b in table]

    @invariant()
    def cached_blocks_hold_what_their_hash_claims(self) -> None:
        for request in self.scheduler.requests.values():
            self._record_claims(request)
        for block_hash, block in self.kv.block_pool.cached_blocks.items():
            assert block.block_hash == block_hash
            assert [self.slots[block.block_id].get(o) for o in range(self.config.block_size)] == self.claims[block_hash]

    @invariant()
    def queues_match_statuses(self) -> None:
        scheduler = self.scheduler
        running = {r.request_id for r in scheduler.running}
        waiting = {r.request_id for r in scheduler.waiting}
        assert len(running) == scheduler.num_running and len(waiting) == scheduler.num_waiting
        assert not running & waiting and running | waiting == set(scheduler.requests)
        assert scheduler.num_running <= self.config.max_num_seqs
        assert set(self.kv.req_to_blocks) == running
        for request in scheduler.requests.values():
            if request.request_id in running:
                assert request.status == RequestStatus.RUNNING
            else:
                assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
                assert request.num_computed_tokens == 0
            assert request.all_token_ids == self.expected_tokens[request.request_id]
        stats = scheduler.stats()
        assert 0.0 <= stats.kv_cache_usage <= 1.0 and stats.prefix_cache_hits <= stats.prefix_cache_queries

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for _ in range(DRAIN_STEPS):
            if not self.scheduler.has_unfinished_requests():
                break
            self._step(lambda n: [7] * n)
        assert not self.scheduler.has_unfinished_requests(), "requests did not finish"
        assert self.kv.num_free_blocks == self.kv.block_pool.num_usable_blocks
        assert all(r.is_finished for r in self.requests.values())

    # ---- helpers -----------------------------------------------------------------------------

    def _record_claims(self, request: Request) -> None:
        bs = self.config.block_size
        for i, block_hash in enumerate(request.block_hashes):
            claim = [(request.cache_salt, t) for t in request.all_token_ids[i * bs : (i + 1) * bs]]
            assert self.claims.setdefault(block_hash, claim) == claim, "two contents under one hash"

    def _new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    def _add(self, request: Request, fork_of: str | None = None) -> None:
        config = self.config
        num_prompt = request.num_prompt_tokens
        blocks_needed = -(-kv_tokens_needed(num_prompt, request.max_tokens) // config.block_size)
        impossible = blocks_needed > config.num_blocks - 1 or (
            not config.enable_chunked_prefill and num_prompt > config.max_num_batched_tokens
        )
        try:
            self.scheduler.add_request(request, fork_of=fork_of)
        except ValueError:
            assert impossible
            return
        assert not impossible
        self.requests[request.request_id] = request
        self.expected_tokens[request.request_id] = list(request.prompt_token_ids)

    @rule(data=st.data())
    def abort_while_a_step_is_in_flight(self, data) -> None:
        def abort_one(output: SchedulerOutput) -> None:
            if output.scheduled:
                victim = data.draw(st.sampled_from([s.request_id for s in output.scheduled]))
                self.scheduler.abort_requests([victim])
                self.unreported_finished.add(victim)

        self._step(lambda n: data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)), abort_one)

    def _step(self, draw_tokens, before_update=lambda output: None) -> None:
        output = self.scheduler.schedule()
        self._check_output(output)
        sampled = self._execute(output, draw_tokens)
        before_update(output)
        still_running = {s.request_id for s in output.scheduled if s.sample and not s.request.is_finished}
        updates = self.scheduler.update(output, sampled)
        assert {u.request_id for u in updates} == still_running
        for s in output.scheduled:
            self._record_claims(s.request)
        for update in updates:
            request = update.request
            assert update.new_token_ids == sampled[request.request_id][: len(update.new_token_ids)]
            self.expected_tokens[request.request_id] += update.new_token_ids
            self._check_stop_decision(request, update.finished)
            if update.finished:
                self.unreported_finished.add(request.request_id)

    def _check_output(self, output: SchedulerOutput) -> None:
        config = self.config
        assert output.finished_request_ids == self.unreported_finished
        self.unreported_finished = set()
        ids = [s.request_id for s in output.scheduled]
        assert len(ids) == len(set(ids)) <= config.max_num_seqs
        assert output.total_num_tokens <= config.max_num_batched_tokens
        assert not output.preempted_request_ids & set(ids)
        for request_id in output.preempted_request_ids:
            assert self.requests[request_id].status == RequestStatus.PREEMPTED
        for s in output.scheduled:
            request = s.request
            assert request.status == RequestStatus.RUNNING and s.num_tokens > 0
            expected = self.expected_tokens[s.request_id]
            assert s.token_ids == expected[s.start_position : s.start_position + s.num_tokens]
            assert s.sample == (s.start_position + s.num_tokens == len(expected))
            assert len(s.block_ids) * config.block_size >= s.start_position + s.num_tokens
            assert 0 not in s.block_ids
            if config.long_prefill_token_threshold and not s.sample:
                assert s.num_tokens <= config.long_prefill_token_threshold

    def _execute(self, output: SchedulerOutput, draw_tokens) -> dict[str, list[int]]:
        bs = self.config.block_size
        blocks = self.kv.block_pool.blocks
        # as in every layer of a step: all the step's keys and values are written before any row attends,
        # so a request may read a block that another request of the same step completes
        written: set[tuple[int, int]] = set()
        for s in output.scheduled:
            for p, token in enumerate(s.token_ids, start=s.start_position):
                block = blocks[s.block_ids[p // bs]]
                assert block.block_hash is None, f"write into cached {block}"
                assert (block.block_id, p % bs) not in written, f"two writes into slot {p % bs} of {block}"
                written.add((block.block_id, p % bs))
                self.slots[block.block_id][p % bs] = (s.request.cache_salt, token)
        for s in output.scheduled:
            expected = self.expected_tokens[s.request_id]
            for p in range(s.start_position):
                slot = self.slots[s.block_ids[p // bs]].get(p % bs)
                assert slot == (s.request.cache_salt, expected[p]), (s.request_id, p)
        to_sample = [s.request_id for s in output.scheduled if s.sample]
        return {request_id: [token] for request_id, token in zip(to_sample, draw_tokens(len(to_sample)), strict=True)}

    def _check_stop_decision(self, request: Request, finished: bool) -> None:
        params = request.sampling_params
        last = request.output_token_ids[-1]
        stop_token = request.num_output_tokens >= params.min_tokens and (
            (last == EOS and not params.ignore_eos) or last in params.stop_token_ids
        )
        at_length = request.num_tokens >= MAX_MODEL_LEN or request.num_output_tokens == params.max_tokens
        assert finished == (stop_token or at_length)
        if finished:
            assert request.finish_reason == ("stop" if stop_token else "length")
            eos_stop = stop_token and last == EOS and not params.ignore_eos
            assert request.stop_reason == (last if stop_token and not eos_stop else None)


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_scheduler_state_machine = SchedulerMachine.TestCase
