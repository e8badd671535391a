"""Logprobs in OpenAI's shapes (completions' parallel lists, chat's per-token objects) and vLLM's
prompt_logprobs. JSON has no -inf, so impossible tokens get -9999.0 as in vLLM."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tokenmill.outputs import Logprob

_FLOOR = -9999.0


def finite(value: float) -> float:
    return _FLOOR if math.isinf(value) or math.isnan(value) else max(value, _FLOOR)


def token_string(token_id: int, logprob: Logprob | None, as_ids: bool) -> str:
    if as_ids or logprob is None or logprob.decoded_token is None:
        return f"token_id:{token_id}"
    return logprob.decoded_token


def _top(position: dict[int, Logprob], limit: int) -> list[tuple[int, Logprob]]:
    ranked = sorted(position.items(), key=lambda item: item[1].rank if item[1].rank is not None else math.inf)
    return ranked[:limit]


class CompletionLogprobs:
    """Builds the completions ``logprobs`` object incrementally (streams continue the text offsets)."""

    def __init__(self, top: int, as_ids: bool, text_offset: int = 0) -> None:
        self.top = top
        self.as_ids = as_ids
        self.offset = text_offset

    def build(self, token_ids: Sequence[int], positions: Sequence[dict[int, Logprob] | None],
              texts: Sequence[str] | None = None) -> dict[str, Any]:
        """Logprobs of ``token_ids``; a position that is None (the first prompt token) has no logprob.
        ``texts`` gives each token's text where the positions may lack it (the prompt)."""
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for index, (token_id, position) in enumerate(zip(token_ids, positions, strict=False)):
            chosen = position.get(token_id) if position else None
            text = token_string(token_id, chosen, self.as_ids)
            if texts is not None and not self.as_ids and (chosen is None or chosen.decoded_token is None):
                text = texts[index]
            tokens.append(text)
            token_logprobs.append(None if chosen is None else finite(chosen.logprob))
            if position is None:
                tops.append(None)
            else:
                ranked = _top(position, self.top)
                if chosen is not None and all(t != token_id for t, _ in ranked):
                    ranked.append((token_id, chosen))
                tops.append({token_string(t, lp, self.as_ids): finite(lp.logprob) for t, lp in ranked})
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(token_ids: Sequence[int], positions: Sequence[dict[int, Logprob]], top: int,
                  as_ids: bool) -> dict[str, Any]:
    """The chat ``logprobs`` object: one entry per token with its top alternatives."""
    content = []
    for token_id, position in zip(token_ids, positions, strict=False):
        chosen = position.get(token_id)
        text = token_string(token_id, chosen, as_ids)
        content.append({
            "token": text, "logprob": finite(chosen.logprob) if chosen else _FLOOR,
            "bytes": list(text.encode("utf-8", "replace")),
            "top_logprobs": [{"token": (s := token_string(t, lp, as_ids)), "logprob": finite(lp.logprob),
                              "bytes": list(s.encode("utf-8", "replace"))} for t, lp in _top(position, top)],
        })
    return {"content": content}


def prompt_logprobs_json(positions: Sequence[dict[int, Logprob] | None] | None) -> list[Any] | None:
    """vLLM's ``prompt_logprobs``: per prompt position {token id: {logprob, rank, decoded_token}} or null."""
    if positions is None:
        return None
    return [None if position is None else {
        str(token_id): {"logprob": finite(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
        for token_id, lp in position.items()} for position in positions]
