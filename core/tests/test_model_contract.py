"""The model contract (tokenmill.plugin_api.Model): every built-in model states every member, and
build_model refuses a registered class that lacks one, naming what is missing."""

import importlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader import model_loader
from tokenmill.models.registry import BUILTIN_MODELS, TRANSFORMERS_FALLBACK
from tokenmill.plugin_api import EncoderModel, Model
from tokenmill.plugin_api.model import missing_members


def model_class(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", sorted({*BUILTIN_MODELS.values(), TRANSFORMERS_FALLBACK}))
def test_every_builtin_model_states_the_whole_contract(path):
    cls = model_class(path)
    assert missing_members(cls) == []
    assert isinstance(cls.is_encoder, bool)


class Partial(nn.Module):
    """A plugin model written against the old docstring: no greedy_token_ids, is_encoder or default_pooling."""

    def __init__(self, hf_config, build):
        super().__init__()
        self.proj = nn.Linear(2, 2)

    def forward(self, input_ids, positions, ctx):
        return self.proj(torch.zeros(len(input_ids), 2))

    def compute_logits(self, hidden):
        return hidden.float()

    def load_weights(self, weights):
        return set()

    def attention_specs(self):
        return []


class Whole(Partial):
    """The same model, stating the rest of the contract."""

    is_encoder = False
    default_pooling = None

    def greedy_token_ids(self, hidden):
        return None


def test_build_model_names_the_members_a_registered_class_lacks(monkeypatch):
    monkeypatch.setattr(model_loader, "resolve_model_class", lambda config: Partial)
    with pytest.raises(TypeError, match=r"Partial does not implement the model contract \(tokenmill.plugin_api.Model\): "
                                        r"missing is_encoder, default_pooling, greedy_token_ids"):
        model_loader.build_model(SimpleNamespace(), ModelBuildContext())


def test_a_whole_model_builds_and_is_a_model(monkeypatch):
    monkeypatch.setattr(model_loader, "resolve_model_class", lambda config: Whole)
    model = model_loader.build_model(SimpleNamespace(), ModelBuildContext())
    assert isinstance(model, Model) and not isinstance(model, EncoderModel)
    assert not isinstance(Partial(None, None), Model)


def test_an_encoder_must_embed_whole_sequences():
    class Encoder(Whole):
        is_encoder = True

    assert missing_members(Encoder(None, None)) == ["embed_hidden"]


def protocol_members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    return names | {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}


def test_core_contexts_are_what_the_contract_promises_a_model():
    from tokenmill.layers.context import AttentionContext
    from tokenmill.plugin_api import BuildContext, StepContext

    build = ModelBuildContext()
    assert {name for name in protocol_members(BuildContext) if not hasattr(build, name)} == set()
    step = AttentionContext(backend=None, metadata=None, kv_caches=[])
    assert {name for name in protocol_members(StepContext) if not hasattr(step, name)} == set()
    assert protocol_members(BuildContext) >= {"linear", "lm_head", "attention_spec", "dtype", "layer_kernels"}
