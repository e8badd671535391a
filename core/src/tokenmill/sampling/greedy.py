"""GreedyArgmax: the one place greedy token ids are taken, from logits or from a model's hidden states.

A greedy token is the argmax of a row's float32 logits, ties and NaN rows going to the lowest index
(``torch.argmax``). Three callers need it: the sampler (greedy rows of processed logits), the runner
(a step whose rows are all greedy, without logprobs or logits processors) and speculative decoding
(the target's choice at every draft row, and a draft model's own tokens). All of them ask this
object, which asks the platform's ``LayerKernels`` first and falls back to torch:

* ``argmax(logits)``: the platform's ``argmax_rows``, else ``logits.argmax(-1)``;
* ``from_head(model, hidden)``: the model's ``greedy_token_ids`` (its LM head's ``greedy_lm_head``),
  which may skip most logits, or None when the model or platform does not answer;
* ``token_ids(model, hidden)``: ``from_head``, else ``argmax(model.compute_logits(hidden))``.

Every route returns the same tokens up to the float32 product's rounding (the contract of
``greedy_lm_head``); the routes differ only in what they compute.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.plugin_api import LayerKernels
from tokenmill.plugin_api.model import Model

PREPARE_ROWS = (1, 8)  # one row, and a batch past any platform's small-step path (the CPU's int8 one takes 1-2)


class GreedyArgmax:
    """Greedy token ids through the platform's ``kernels`` where they answer, else through torch."""

    def __init__(self, kernels: LayerKernels | None = None) -> None:
        self.kernels = kernels

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """int64 [N]: each row's argmax of ``logits`` [N, V] (the first index of its maximum)."""
        if self.kernels is not None:
            token_ids = self.kernels.argmax_rows(logits)
            if token_ids is not None:
                return token_ids
        return logits.argmax(dim=-1)

    @staticmethod
    def from_head(model: Model, hidden: torch.Tensor) -> torch.Tensor | None:
        """int64 [N] from the model's ``greedy_token_ids`` (without forming every logit), or None when
        its head or platform declines these rows."""
        return model.greedy_token_ids(hidden)

    def token_ids(self, model: Any, hidden: torch.Tensor) -> torch.Tensor:
        """int64 [N]: the greedy token of each row of ``hidden`` [N, hidden] under ``model``'s LM head."""
        token_ids = self.from_head(model, hidden)
        if token_ids is None:
            token_ids = self.argmax(model.compute_logits(hidden))
        return token_ids

    def prepare(self, model: Any, hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Run ``from_head`` on zero rows of each size in ``PREPARE_ROWS``, so that what a platform
        derives from the LM head at its first call of either size (the CPU platform's int8 copy for
        one or two rows, its bfloat16 copy and row norms for more) is made before the first request."""
        if hidden_size > 0:
            for rows in PREPARE_ROWS:
                self.from_head(model, torch.zeros(rows, hidden_size, dtype=dtype, device=device))
