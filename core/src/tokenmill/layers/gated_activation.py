"""GatedActivation: ``act(gate) * up`` over a fused ``(gate, up)`` input, for the activations configs name.

The names are those of Hugging Face's ``hidden_act`` / ``hidden_activation``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def activation(name: str, where: str = "the model") -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function called ``name``; a clear error naming the supported ones otherwise."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"{where}: activation {name!r} is not supported (supported: {', '.join(ACTIVATIONS)})") from None


class GatedActivation(nn.Module):
    """``act(gate) * up`` for an input ``[..., 2 * d]`` laid out as ``(gate, up)``."""

    def __init__(self, name: str, where: str = "the model"):
        super().__init__()
        self.name = name
        self.fn = activation(name, where)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return self.fn(gate) * up

    def extra_repr(self) -> str:
        return self.name
