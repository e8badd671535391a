"""Parallel sampling (``n`` > 1, ``best_of``): one user request fanned out into child engine
requests, and the children's completions folded back into the user's ``n``.

Both front ends (``LLMEngine`` and ``AsyncLLM``) go through ``OutputProcessor.add_request``, which
calls ``fan_out``; ``RequestState`` calls ``best_completions`` when a best_of request finishes.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from tokenmill.outputs import CompletionOutput
from tokenmill.sampling_params import SamplingParams
from tokenmill.wire import EngineCoreRequest


def child_request_id(index: int, parent_id: str) -> str:
    """The engine-core id of the ``index``-th sequence of a request sampled more than once."""
    return f"{index}_{parent_id}"


def fan_out(request: EngineCoreRequest) -> list[EngineCoreRequest]:
    """The engine requests that run ``request``: itself when it samples one sequence, else one
    child per candidate (``num_candidates``).

    Child ``i`` gets id ``child_request_id(i, request_id)``, seed ``seed + i``, the prompt logprobs
    only when ``i`` is 0, and logprobs=0 when ``best_of`` > ``n`` and the user asked for none, so the
    children's cumulative logprobs can be ranked at the end. Every child after the first names the
    first in ``fork_of``: they share its prompt's full KV blocks.
    """
    params = request.sampling_params
    if params.num_candidates == 1:
        return [request]
    first = child_request_id(0, request.request_id)
    return [msgspec.structs.replace(request, request_id=child_request_id(index, request.request_id),
                                    sampling_params=_child_params(params, index),
                                    fork_of=None if index == 0 else first)
            for index in range(params.num_candidates)]


def best_completions(completions: Sequence[CompletionOutput], n: int) -> list[CompletionOutput]:
    """The ``n`` completions with the highest cumulative logprob, best first, re-indexed 0..n-1."""
    ranked = sorted(completions, reverse=True,
                    key=lambda c: float("-inf") if c.cumulative_logprob is None else c.cumulative_logprob)[:n]
    for index, completion in enumerate(ranked):
        completion.index = index
    return ranked


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    logprobs = params.logprobs
    if logprobs is None and params.num_candidates > params.n:
        logprobs = 0
    return params.clone(
        n=1,
        best_of=None,
        seed=None if params.seed is None else params.seed + index,
        logprobs=logprobs,
        prompt_logprobs=params.prompt_logprobs if index == 0 else None,
    )
