"""GreedyArgmax: the one owner of greedy token ids, asked by the sampler, the runner and speculative decoding."""

from __future__ import annotations

import torch

from tokenmill.plugin_api import LayerKernels
from tokenmill.sampling.greedy import GreedyArgmax


class RowArgmax(LayerKernels):
    """A platform whose ``argmax_rows`` answers (with torch), counting calls."""

    def __init__(self) -> None:
        self.calls = 0

    def argmax_rows(self, logits):
        self.calls += 1
        return logits.argmax(dim=-1)


class HeadModel:
    """A model with a plain float32 head and, unless ``declines``, a greedy shortcut counting its calls."""

    def __init__(self, weight: torch.Tensor, declines: bool = False) -> None:
        self.weight, self.declines, self.shortcuts = weight, declines, 0

    def compute_logits(self, hidden):
        return hidden @ self.weight.T

    def greedy_token_ids(self, hidden):
        self.shortcuts += 1
        return None if self.declines else self.compute_logits(hidden).argmax(dim=-1)


def test_ties_and_nan_go_to_the_lowest_index_on_every_route():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 5.0, float("nan"), 1.0], [2.0, 2.0, 2.0, 2.0]])
    kernels = RowArgmax()
    assert GreedyArgmax().argmax(logits).tolist() == [1, 0, 0]
    assert GreedyArgmax(kernels).argmax(logits).tolist() == [1, 0, 0] and kernels.calls == 1


def test_token_ids_take_the_heads_shortcut_else_the_argmax_of_the_logits():
    torch.manual_seed(0)
    weight, hidden = torch.randn(50, 8), torch.randn(5, 8)
    expected = (hidden @ weight.T).argmax(dim=-1).tolist()
    kernels = RowArgmax()
    answering, declining = HeadModel(weight), HeadModel(weight, declines=True)
    assert GreedyArgmax(kernels).token_ids(answering, hidden).tolist() == expected
    assert answering.shortcuts == 1 and kernels.calls == 0
    assert GreedyArgmax(kernels).token_ids(declining, hidden).tolist() == expected
    assert declining.shortcuts == 1 and kernels.calls == 1
    assert GreedyArgmax.from_head(declining, hidden) is None


def test_prepare_asks_the_head_once_per_row_count_and_nothing_without_a_hidden_size():
    model = HeadModel(torch.randn(10, 4))
    greedy = GreedyArgmax()
    greedy.prepare(model, 4, torch.float32, torch.device("cpu"))
    greedy.prepare(model, 0, torch.float32, torch.device("cpu"))
    assert model.shortcuts == 2
