"""GrammarQueue: constrained requests waiting for their grammar, compiled on a worker thread.

xgrammar releases the GIL while it compiles, so the engine keeps stepping the other requests meanwhile,
however long a large schema takes to compile. Requests leave the queue in arrival
order, so a request forked from another (n > 1) never overtakes its parent."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from tokenmill.structured.grammar_compiler import StructuredOutputCompiler
from tokenmill.structured.request_grammar import RequestGrammar

if TYPE_CHECKING:
    from tokenmill.request import Request


class GrammarQueue:
    """Compiles each submitted request's constraint in the background; ``ready`` hands back the leading
    requests whose grammar is done (or whose constraint failed to compile: the ValueError instead)."""

    def __init__(self, compiler: StructuredOutputCompiler) -> None:
        self.compiler = compiler
        self._executor: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[Request, str | None, Future]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, request: Request, fork_of: str | None) -> None:
        """Start compiling ``request``'s constraint (its stop tokens end the grammar)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenmill-grammar")
        future = self._executor.submit(self.compiler.grammar, request.sampling_params.structured_outputs,
                                       request.eos_token_ids | request.stop_token_ids)
        self._pending.append((request, fork_of, future))

    def ready(self, wait_s: float = 0.0) -> list[tuple[Request, str | None, RequestGrammar | ValueError]]:
        """Pop the leading requests whose compilation ended, waiting up to ``wait_s`` for the first."""
        if self._pending and wait_s > 0:
            wait([self._pending[0][2]], timeout=wait_s)
        done: list[tuple[Request, str | None, RequestGrammar | ValueError]] = []
        while self._pending and self._pending[0][2].done():
            request, fork_of, future = self._pending.popleft()
            try:
                done.append((request, fork_of, future.result()))
            except ValueError as error:
                done.append((request, fork_of, error))
        return done

    def remove(self, request_ids: Iterable[str]) -> list[Request]:
        """Drop these requests (aborted before their grammar was ready); returns those that were queued."""
        wanted = set(request_ids)
        removed = [entry for entry in self._pending if entry[0].request_id in wanted]
        for _, _, future in removed:
            future.cancel()
        self._pending = deque(entry for entry in self._pending if entry[0].request_id not in wanted)
        return [request for request, _, _ in removed]

    def shutdown(self) -> None:
        """Stop the worker, dropping compilations not started."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
