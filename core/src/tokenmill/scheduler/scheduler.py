"""Scheduler: each step, how many tokens of which requests to run, under a token and sequence budget."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tokenmill.kv_cache.block import KVCacheBlock
from tokenmill.kv_cache.manager import KVCacheManager
from tokenmill.request import Request, RequestStatus
from tokenmill.scheduler.config import SchedulerConfig
from tokenmill.scheduler.output import ScheduledRequest, SchedulerOutput
from tokenmill.scheduler.queues import create_request_queue
from tokenmill.scheduler.request_update import RequestUpdate
from tokenmill.scheduler.stats import SchedulerStats
from tokenmill.spec_decode.verification import can_speculate


@dataclass
class _StepPlan:
    budget: int
    num_scheduled: dict[Request, int] = field(default_factory=dict)  # insertion order is batch order
    num_spec: dict[Request, int] = field(default_factory=dict)  # draft tokens among the scheduled ones
    preempted: set[str] = field(default_factory=set)

    def add(self, request: Request, num_tokens: int, num_spec: int = 0) -> None:
        self.num_scheduled[request] = num_tokens
        self.budget -= num_tokens
        if num_spec:
            self.num_spec[request] = num_spec

    def drop(self, request: Request) -> None:
        self.budget += self.num_scheduled.pop(request, 0)
        self.num_spec.pop(request, None)


class Scheduler:
    """vLLM-v1-style scheduling: one map {request: number of tokens} per step covers prefill,
    chunked prefill, decode and prefix-cache hits.

    A step serves running requests first (their decode token or next prefill chunk), preempting
    the lowest-priority / latest running request by recompute when blocks run out, and only then,
    if nothing was preempted, admits waiting requests with the budget left. The engine calls
    ``schedule()``, runs the model, then ``update()`` with the sampled tokens.

    With speculative decoding a decoding request also feeds its ``spec_token_ids`` (draft tokens,
    set by the engine before ``schedule()`` for the requests ``draft_budget`` allows), and ``update()``
    keeps only the K/V of the tokens the model confirmed.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv_cache_manager = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting = create_request_queue(config.policy)  # new and preempted requests
        self.running: list[Request] = []  # in admission order
        self.finished_request_ids: set[str] = set()  # since the last schedule()
        self.num_preemptions = 0
        self._fork_parents: dict[str, str] = {}
        self.spec_num_drafts = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def add_request(self, request: Request, fork_of: str | None = None) -> None:
        """Queue a request; ValueError if it could never run under this configuration.

        With ``fork_of`` (a parent's id, e.g. for n > 1 samples of one prompt), the request shares
        the parent's full computed blocks, even without prefix caching: while the parent is running
        but has not computed them yet, the request waits for it instead of computing its own copy.
        """
        self.check_admissible(request)
        self.requests[request.request_id] = request
        if fork_of is not None:
            self._fork_parents[request.request_id] = fork_of
        self.waiting.add(request)

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        """Abort requests at any stage, freeing their blocks; returns those that were unfinished."""
        return self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(
        self, request_ids: Iterable[str], status: RequestStatus, stop_reason: int | str | None = None
    ) -> list[Request]:
        """End requests with a final ``status`` (e.g. a stop string matched by the front end).

        Unknown or already finished ids are skipped. Returns the requests finished by this call.
        """
        assert status.is_finished, f"{status.name} is not a final status"
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        finished: list[Request] = []
        queued: set[str] = set()
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status != RequestStatus.RUNNING:
                queued.add(request_id)
            request.finish(status, stop_reason)
            self._release(request)
            finished.append(request)
        if queued:
            self.waiting.remove_many(queued)
        if len(queued) < len(finished):
            self.running = [r for r in self.running if not r.is_finished]
        return finished

    def schedule(self) -> SchedulerOutput:
        """Plan one step. Tokens whose K/V is cached (prefix hits, forks) count as computed."""
        plan = _StepPlan(budget=self.config.max_num_batched_tokens)
        self.kv_cache_manager.begin_step()
        self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan)
        output = SchedulerOutput(
            scheduled=[self._scheduled_request(r, n, plan.num_spec.get(r, 0)) for r, n in plan.num_scheduled.items()],
            preempted_request_ids=plan.preempted,
            finished_request_ids=self.finished_request_ids,
        )
        self.finished_request_ids = set()
        return output

    def update(self, scheduler_output: SchedulerOutput, sampled_token_ids: dict[str, list[int]]) -> list[RequestUpdate]:
        """Apply a finished step: advance computed tokens, cache full blocks, append sampled tokens,
        check stops and free finished requests. Returns one update per request that got tokens.

        A pooling request finishes (and frees its blocks) with the chunk that ends its prompt, gaining no
        token. Requests that finished (aborted, stopped) after ``schedule()`` are skipped. A request that fed
        ``k`` draft tokens gets up to ``k + 1`` tokens; the K/V of the drafts after the first rejected one
        is forgotten (those slots are written again by the next step).
        """
        updates: list[RequestUpdate] = []
        any_finished = False
        max_model_len = self.config.max_model_len
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            if request.status != RequestStatus.RUNNING:
                continue
            request.spec_token_ids = []
            if not scheduled.sample:
                request.num_computed_tokens += scheduled.num_tokens
                self.kv_cache_manager.cache_blocks(request)
                continue
            if request.pooling is not None:  # its whole prompt has run and the runner pooled it: done
                request.num_computed_tokens = request.num_tokens
                request.finish(RequestStatus.FINISHED_STOPPED)
                self._release(request)
                any_finished = True
                updates.append(RequestUpdate(request, [], True))
                continue
            token_ids = sampled_token_ids.get(request.request_id)
            if not token_ids:
                raise ValueError(f"request {request.request_id!r} was scheduled to sample but no token was sampled")
            if scheduled.num_spec_tokens:
                self.spec_num_drafts += 1
                self.spec_num_draft_tokens += scheduled.num_spec_tokens
                self.spec_num_accepted_tokens += min(len(token_ids) - 1, scheduled.num_spec_tokens)
            new_token_ids = []
            for token_id in token_ids:
                if not request.append_output_token(token_id):
                    request.finish(RequestStatus.FINISHED_ABORTED)  # its grammar allowed no next token
                    break
                new_token_ids.append(token_id)
                if request.check_stop(max_model_len):
                    break
            # a sampling chunk ends the known tokens: every kept token but the newest has its K/V (drafts
            # after the first rejected one, or after a stop, are forgotten)
            request.num_computed_tokens = request.num_tokens - 1
            self.kv_cache_manager.cache_blocks(request)
            if request.is_finished:
                self._release(request)
                any_finished = True
            updates.append(RequestUpdate(request, new_token_ids, request.is_finished))
        if any_finished:
            self.running = [r for r in self.running if not r.is_finished]
        return updates

    def stats(self) -> SchedulerStats:
        prefix = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage(),
            prefix_cache_queries=prefix.queries,
            prefix_cache_hits=prefix.hits,
            num_preemptions=self.num_preemptions,
            spec_num_drafts=self.spec_num_drafts,
            spec_num_draft_tokens=self.spec_num_draft_tokens,
            spec_num_accepted_tokens=self.spec_num_accepted_tokens,
        )

    def draft_budget(self, request: Request, num_speculative_tokens: int) -> int:
        """How many draft tokens are worth proposing for ``request`` now (0 when it cannot speculate):
        it must be running and decoding, and its drafts must fit its ``max_tokens``, ``max_model_len``
        and the KV slots it holds (positions ``num_tokens - 1`` on, where the drafter writes)."""
        if request.status != RequestStatus.RUNNING or request.num_computed_tokens != request.num_tokens - 1 \
                or not can_speculate(request):
            return 0
        budget = min(num_speculative_tokens, self.config.max_model_len - request.num_tokens - 1)
        if request.max_tokens is not None:
            budget = min(budget, request.max_tokens - request.num_output_tokens - 1)
        num_slots = len(self.kv_cache_manager.get_block_ids(request.request_id)) * self.config.block_size
        return max(0, min(budget, num_slots - request.num_computed_tokens))

    def reset_prefix_cache(self) -> int:
        """Forget all cached prefixes (running requests keep their blocks); returns how many blocks."""
        return self.kv_cache_manager.reset_prefix_cache()

    def _schedule_running(self, plan: _StepPlan) -> None:
        running = self.running
        index = 0
        while index < len(running) and plan.budget > 0:
            request = running[index]
            num_new = request.num_tokens - request.num_computed_tokens
            num_tokens = self._chunk_size(num_new + self._num_spec(request, num_new), plan.budget)
            num_spec = max(0, num_tokens - num_new)
            while not self._allocate(request, num_tokens, samples=num_tokens >= num_new):
                victim_index = self._victim_index()
                victim = running.pop(victim_index)
                plan.drop(victim)
                self._preempt(victim)
                plan.preempted.add(victim.request_id)
                if victim is request:
                    break
                if victim_index < index:
                    index -= 1
            else:  # allocated (possibly after preempting others)
                plan.add(request, num_tokens, num_spec)
                index += 1

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        config = self.config
        while self.waiting and plan.budget > 0 and len(self.running) < config.max_num_seqs:
            request = self.waiting.peek()
            if self._waits_for_fork_parent(request):
                break
            computed_blocks, num_computed = self._find_computed_blocks(request)
            num_tokens = request.num_tokens - num_computed
            if num_tokens > plan.budget and not config.enable_chunked_prefill:
                if num_tokens <= config.max_num_batched_tokens:
                    break  # waits for a step where it fits whole
                # only a resumed request outgrows the budget: recomputing it in chunks is its only way back
            chunk = self._chunk_size(num_tokens, plan.budget)
            if not self._allocate(request, chunk, chunk == num_tokens, computed_blocks):
                break
            num_tokens = chunk
            self.waiting.pop()
            request.num_computed_tokens = num_computed
            if request.status == RequestStatus.WAITING:
                request.num_cached_tokens = num_computed
                request.first_scheduled_time = time.time()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.add(request, num_tokens)

    def _num_spec(self, request: Request, num_new: int) -> int:
        """Draft tokens to verify this step: the request's proposals, for a decoding request."""
        if num_new != 1 or not request.spec_token_ids:
            return 0
        return min(len(request.spec_token_ids), self.draft_budget(request, len(request.spec_token_ids)))

    def _allocate(self, request: Request, num_tokens: int, samples: bool,
                  computed_blocks: list[KVCacheBlock] | tuple = ()) -> bool:
        """Slots for ``num_tokens``, and for the drafts of the next step after a sampling chunk when
        speculating (without those when the cache is short: the request then decodes plainly)."""
        manager, lookahead = self.kv_cache_manager, self.config.num_lookahead_tokens
        if samples and lookahead and manager.allocate_slots(request, num_tokens + lookahead, computed_blocks):
            return True
        return manager.allocate_slots(request, num_tokens, computed_blocks)

    def _waits_for_fork_parent(self, request: Request) -> bool:
        """A fork waits while its running parent is still computing the prompt blocks it could share."""
        parent = self.requests.get(self._fork_parents.get(request.request_id, ""))
        if parent is None or parent.status != RequestStatus.RUNNING or request.skip_reading_prefix_cache:
            return False
        shareable = (request.num_tokens - 1) // self.config.block_size * self.config.block_size
        return parent.num_computed_tokens < min(shareable, parent.num_prompt_tokens)

    def _find_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        blocks, num_tokens = self.kv_cache_manager.get_computed_blocks(request)
        parent = self.requests.get(self._fork_parents.get(request.request_id, ""))
        if parent is not None and not request.skip_reading_prefix_cache:
            fork_blocks, num_fork_tokens = self.kv_cache_manager.get_fork_blocks(parent, request)
            if num_fork_tokens > num_tokens:
                return fork_blocks, num_fork_tokens
        return blocks, num_tokens

    def _chunk_size(self, num_tokens: int, budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if threshold and num_tokens > threshold:
            num_tokens = threshold
        return min(num_tokens, budget)

    def _victim_index(self) -> int:
        running = self.running
        if self.config.policy == "priority":
            return max(range(len(running)), key=lambda i: (running[i].priority, running[i].arrival_time, i))
        return len(running) - 1

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_preempted(request)

    def _release(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self._fork_parents.pop(request.request_id, None)
        self.finished_request_ids.add(request.request_id)

    def _scheduled_request(self, request: Request, num_tokens: int, num_spec: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        known = num_tokens - num_spec
        return ScheduledRequest(
            request=request,
            token_ids=request.all_token_ids[start : start + known] + request.spec_token_ids[:num_spec],
            start_position=start,
            block_ids=list(self.kv_cache_manager.get_block_ids(request.request_id)),
            sample=start + known == request.num_tokens,
            num_spec_tokens=num_spec,
        )

    def check_admissible(self, request: Request) -> None:
        """ValueError if ``request`` could never run here (id in use, empty or too long a prompt)."""
        config = self.config
        request_id = request.request_id
        num_prompt = request.num_prompt_tokens
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if num_prompt == 0:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        if num_prompt > config.max_model_len:
            raise ValueError(
                f"request {request_id!r}: the prompt has {num_prompt} tokens, more than max_model_len "
                f"({config.max_model_len})"
            )
        if not config.enable_chunked_prefill and num_prompt > config.max_num_batched_tokens:
            raise ValueError(
                f"request {request_id!r}: the prompt has {num_prompt} tokens, more than max_num_batched_tokens "
                f"({config.max_num_batched_tokens}); enable chunked prefill or raise the limit"
            )
        max_tokens = request.max_tokens
        limit = max(config.max_model_len, num_prompt + 1)
        max_kv_tokens = (limit if max_tokens is None else min(num_prompt + max_tokens, limit)) - 1
        num_blocks = -(-max_kv_tokens // config.block_size)
        num_usable = self.kv_cache_manager.block_pool.num_usable_blocks
        if num_blocks > num_usable:
            raise ValueError(
                f"request {request_id!r} can never fit in the KV cache: a prompt of {num_prompt} tokens with "
                f"max_tokens={max_tokens} needs K/V for up to {max_kv_tokens} tokens = {num_blocks} blocks of "
                f"{config.block_size}, but the cache has {num_usable} blocks ({num_usable * config.block_size} tokens)"
            )
