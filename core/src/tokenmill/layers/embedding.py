"""VocabEmbedding (token ids to vectors) and LMHead (vectors to vocabulary logits, tied or not)."""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.plugin_api import LayerKernels, LinearSpec, Quantizer, QuantKernel
from tokenmill.plugin_api.linear import Linear

FLOAT32 = torch.float32


class VocabEmbedding(nn.Module):
    """A full-precision ``weight`` [vocab_size, hidden_size] looked up by token id (through the
    platform's ``kernels.gather_rows`` when it takes the ids)."""

    kernels: LayerKernels | None = None

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            rows = self.kernels.gather_rows(self.weight, input_ids)
            if rows is not None:
                return rows
        return nn.functional.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


class LMHead(Linear):
    """The output projection: a Linear that returns float32 logits.

    With ``tied_to`` it reuses the embedding's ``weight`` (``tie_word_embeddings``) instead of
    creating its own, so ``quantizer`` must then be one whose kernel reads a plain ``weight``.
    """

    def __init__(self, spec: LinearSpec, quantizer: Quantizer, kernel: QuantKernel,
                 tied_to: VocabEmbedding | None = None):
        super().__init__(spec, quantizer, kernel, create_weights=tied_to is None)
        self.tied = tied_to is not None
        if tied_to is not None:
            self.weight = tied_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden).float()

    def greedy_token_ids(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax of ``forward(hidden)`` (int64 [N]) from the platform's ``greedy_lm_head``,
        which need not compute every logit; None unless the head is a float32 product of a plain
        weight without bias and the platform answers."""
        kernels = getattr(self, "kernels", None)
        weight = getattr(self, "weight", None)
        if kernels is None or self.bias is not None or not self.kernel.plain_weight:
            return None
        if not isinstance(weight, torch.Tensor) or weight.dtype is not FLOAT32 or hidden.dtype is not FLOAT32:
            return None
        return kernels.greedy_lm_head(hidden, weight)
