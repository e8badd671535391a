"""Log-probabilities for users: of sampled tokens (per row) and of prompt tokens (per position)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenmill.wire import LogprobsEntry

# prompt positions are processed in slices so a long prompt never needs a [T, V] float32 copy at once
_PROMPT_SLICE = 512


def logprobs_entries(logits: torch.Tensor, token_ids: torch.Tensor, num_logprobs: Sequence[int]) -> list[LogprobsEntry]:
    """One entry per row of ``logits`` [R, V]: ``token_ids[r]`` first, then the row's top
    ``num_logprobs[r]`` tokens, best first, with 1-based ranks in the full distribution."""
    if logits.shape[0] == 0:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = token_ids.to(device=logprobs.device, dtype=torch.long).unsqueeze(1)
    chosen_logprobs = logprobs.gather(1, chosen)
    chosen_ranks = (logprobs > chosen_logprobs).sum(dim=-1) + 1
    max_k = max(num_logprobs)
    top_logprobs, top_ids = logprobs.topk(max_k, dim=-1) if max_k > 0 else (None, None)

    chosen_list = chosen.squeeze(1).tolist()
    chosen_lp_list = chosen_logprobs.squeeze(1).tolist()
    rank_list = chosen_ranks.tolist()
    top_lp_list = top_logprobs.tolist() if top_logprobs is not None else None
    top_id_list = top_ids.tolist() if top_ids is not None else None
    entries = []
    for row, k in enumerate(num_logprobs):
        ids, lps, ranks = [chosen_list[row]], [chosen_lp_list[row]], [rank_list[row]]
        if k > 0:
            ids += top_id_list[row][:k]
            lps += top_lp_list[row][:k]
            ranks += list(range(1, k + 1))
        entries.append(LogprobsEntry(token_ids=ids, logprobs=lps, ranks=ranks))
    return entries


def prompt_logprobs_for_chunk(
    logits: torch.Tensor, prompt_token_ids: Sequence[int], start_position: int, num_logprobs: int
) -> list[LogprobsEntry | None]:
    """Prompt logprobs contributed by one prefill chunk.

    ``logits`` [T, V] are the model outputs at positions ``start_position .. start_position + T - 1``;
    the output at position p scores prompt token p + 1. Concatenating the results of consecutive
    chunks gives one entry per prompt token, the first being None (nothing predicts it). Positions
    whose next token is not a prompt token (the last prompt position, recomputed outputs) give none.
    """
    prompt_len = len(prompt_token_ids)
    first_target = start_position + 1
    last_target = min(start_position + logits.shape[0], prompt_len - 1)
    entries: list[LogprobsEntry | None] = [None] if start_position == 0 and prompt_len > 0 else []
    targets = torch.tensor(prompt_token_ids[first_target : last_target + 1], dtype=torch.long)
    scoring_logits = logits[: len(targets)]
    for begin in range(0, len(targets), _PROMPT_SLICE):
        rows = slice(begin, begin + _PROMPT_SLICE)
        entries += logprobs_entries(scoring_logits[rows], targets[rows], [num_logprobs] * len(targets[rows]))
    return entries
