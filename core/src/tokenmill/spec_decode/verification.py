"""Which requests speculate, and how a verified step turns draft tokens into output tokens."""

from __future__ import annotations

from collections.abc import Sequence

from tokenmill.request import Request


def can_speculate(request: Request) -> bool:
    """Whether draft tokens can be checked by comparing them with the target's argmax: a greedy request
    whose next tokens no logits processor changes (no penalties, bias, allowed or banned tokens, no
    ``min_tokens`` still pending) and that asks for no logprobs. Others decode one token a step."""
    params = request.sampling_params
    return (params.greedy and params.logprobs is None and params.presence_penalty == 0.0
            and params.frequency_penalty == 0.0 and params.repetition_penalty == 1.0 and not params.logit_bias
            and params.allowed_token_ids is None and not params.bad_words_token_ids
            and request.num_output_tokens >= params.min_tokens)


def accept_greedy(draft_token_ids: Sequence[int], target_token_ids: Sequence[int]) -> list[int]:
    """The output of a verified step: the target's choices up to and including the first one that
    differs from the draft, or all ``k + 1`` when the ``k`` drafts all match (the last is a bonus).

    ``target_token_ids[i]`` is the target's argmax after feeding the token before ``draft_token_ids[i]``
    (and ``target_token_ids[k]`` the one after the last draft), so every returned token is exactly what
    decoding one token at a time would have chosen.
    """
    if len(target_token_ids) != len(draft_token_ids) + 1:
        raise ValueError(f"{len(draft_token_ids)} draft tokens need {len(draft_token_ids) + 1} target tokens, "
                         f"got {len(target_token_ids)}")
    accepted: list[int] = []
    for draft, target in zip(draft_token_ids, target_token_ids, strict=False):
        accepted.append(target)
        if draft != target:
            return accepted
    accepted.append(target_token_ids[-1])
    return accepted
