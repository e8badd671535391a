"""The model registry: lazy resolution, plugin registration, clashes and unknown architectures."""

from types import SimpleNamespace

import pytest

from tokenmill.models.llama import LlamaForCausalLM, MistralForCausalLM
from tokenmill.models.registry import ModelRegistry, ModelRegistryError, UnsupportedArchitectureError


def test_builtin_architectures_resolve_lazily():
    registry = ModelRegistry()
    builtin = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
    assert builtin <= set(registry.supported())
    assert registry.resolve("MistralForCausalLM") is MistralForCausalLM
    config = SimpleNamespace(architectures=["SomethingElse", "LlamaForCausalLM"])
    assert registry.resolve_config(config) is LlamaForCausalLM
    assert registry.provider("LlamaForCausalLM") == "tokenmill"


def test_plugin_registration_is_idempotent_and_clashes_name_both_sides():
    registry = ModelRegistry()
    registry.register_all({"TinyForCausalLM": "tokenmill.models.llama:LlamaForCausalLM"}, source="tiny-plugin")
    registry.register_all({"TinyForCausalLM": "tokenmill.models.llama:LlamaForCausalLM"}, source="tiny-plugin")
    assert registry.resolve("TinyForCausalLM") is LlamaForCausalLM
    with pytest.raises(ModelRegistryError, match=r"LlamaForCausalLM is provided twice: by tokenmill "
                                                 r"\(tokenmill.models.llama:LlamaForCausalLM\) and by other-plugin"):
        registry.register("LlamaForCausalLM", "other.models:Llama", source="other-plugin")
    with pytest.raises(ModelRegistryError, match="expected 'package.module:Class'"):
        registry.register("Broken", "no_colon_here")


def test_unknown_architecture_lists_supported_ones():
    registry = ModelRegistry()
    with pytest.raises(UnsupportedArchitectureError, match=r"\(GPT2LMHeadModel\) is not supported; supported: .*LlamaForCausalLM"):
        registry.resolve_config(SimpleNamespace(architectures=["GPT2LMHeadModel"]))
    with pytest.raises(UnsupportedArchitectureError, match="none listed, model_type 'no_such_model'"):
        registry.resolve_config(SimpleNamespace(model_type="no_such_model"))


def test_config_without_architectures_falls_back_to_its_model_type():
    assert ModelRegistry().resolve_config(SimpleNamespace(model_type="llama")) is LlamaForCausalLM


def test_unimportable_plugin_model_is_reported_with_its_source():
    registry = ModelRegistry()
    registry.register("GhostForCausalLM", "ghost_plugin.models:Ghost", source="ghost-plugin")
    with pytest.raises(ModelRegistryError, match="ghost-plugin registers GhostForCausalLM as ghost_plugin"):
        registry.resolve("GhostForCausalLM")
