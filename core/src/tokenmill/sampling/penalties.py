"""Penalties: presence, frequency (OpenAI) and repetition (HF/CTRL) penalties for a batch of rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Penalties:
    """Per-row penalty values with the token histories they apply to.

    Histories are padded with ``vocab_size`` (an extra bin that is dropped after counting).
    ``prompt_tokens`` is None when no row has a repetition penalty, since only that one reads the prompt.
    """

    presence: torch.Tensor  # [N] float
    frequency: torch.Tensor  # [N] float
    repetition: torch.Tensor  # [N] float
    output_tokens: torch.Tensor  # [N, L_out] long
    prompt_tokens: torch.Tensor | None  # [N, L_prompt] long

    @classmethod
    def build(
        cls,
        presence: list[float],
        frequency: list[float],
        repetition: list[float],
        output_histories: Sequence[Sequence[int]],
        prompt_histories: Sequence[Sequence[int]] | None,
        vocab_size: int,
        device: torch.device,
    ) -> Penalties:
        def values(xs: list[float]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.float32, device=device)

        return cls(
            presence=values(presence),
            frequency=values(frequency),
            repetition=values(repetition),
            output_tokens=padded_token_tensor(output_histories, vocab_size, device),
            prompt_tokens=None
            if prompt_histories is None
            else padded_token_tensor(prompt_histories, vocab_size, device),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Penalise ``logits`` [N, V] in place and return them.

        Repetition divides positive logits and multiplies negative ones for every token seen in the
        prompt or the output; frequency subtracts ``penalty * count`` and presence ``penalty`` for
        every token seen in the output.
        """
        num_rows, vocab_size = logits.shape
        output_counts = _bin_counts(self.output_tokens, num_rows, vocab_size)
        output_seen = output_counts > 0
        if self.prompt_tokens is not None:
            seen = output_seen | (_bin_counts(self.prompt_tokens, num_rows, vocab_size) > 0)
            scale = torch.where(seen, self.repetition.unsqueeze(1), 1.0)
            logits = torch.where(logits > 0, logits / scale, logits * scale)
        logits -= self.frequency.unsqueeze(1) * output_counts
        logits -= self.presence.unsqueeze(1) * output_seen
        return logits


def padded_token_tensor(histories: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    """Token lists as one [N, max_len] long tensor, right-padded with ``pad_id``."""
    width = max((len(h) for h in histories), default=0)
    rows = [list(h) + [pad_id] * (width - len(h)) for h in histories]
    return torch.tensor(rows, dtype=torch.long, device=device).reshape(len(histories), width)


def _bin_counts(tokens: torch.Tensor, num_rows: int, vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(num_rows, vocab_size + 1, dtype=torch.float32, device=tokens.device)
    counts.scatter_add_(1, tokens, torch.ones_like(tokens, dtype=torch.float32))
    return counts[:, :vocab_size]
