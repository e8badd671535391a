"""General (pluggy) plugins: validation at discovery, the policy, and the attributed merging of
``configure`` overrides and ``register_models``."""

from types import SimpleNamespace

import pytest

from tokenmill.discovery import (
    PluginConflictError,
    PluginRegistry,
    PluginStatus,
    build_plugin_manager,
    collect_config_overrides,
    collect_models,
)
from tokenmill.plugin_api import hookimpl


def plugin(**hooks):
    return SimpleNamespace(api_version=(2, 0), **{name: hookimpl(function) for name, function in hooks.items()})


def manager_for(plugins, policy=None):
    registry = PluginRegistry.make_test_instance(plugins=plugins, policy=policy, include_core=False)
    return registry, build_plugin_manager(registry)


def test_configure_overrides_are_merged_with_their_plugin_names():
    seen = []

    def tuned(config):
        seen.append(dict(config))
        return {"max_num_seqs": 64}

    _, manager = manager_for({"tuner": plugin(configure=tuned),
                              "agrees": plugin(configure=lambda config: {"max_num_seqs": 64, "block_size": 32}),
                              "silent": plugin(configure=lambda config: None)})
    overrides = collect_config_overrides(manager, {"max_num_seqs": 256})
    assert {k: (c.value, c.plugin) for k, c in overrides.items()} == {
        "max_num_seqs": (64, "agrees"), "block_size": (32, "agrees")}
    assert seen == [{"max_num_seqs": 256}]


def test_the_config_view_is_read_only():
    def mutate(config):
        config["dtype"] = "float16"

    _, manager = manager_for({"rude": plugin(configure=mutate)})
    with pytest.raises(TypeError):
        collect_config_overrides(manager, {"dtype": "auto"})


def test_two_plugins_setting_one_field_differently_is_an_error_naming_both():
    _, manager = manager_for({"a_plugin": plugin(configure=lambda config: {"block_size": 16}),
                              "b_plugin": plugin(configure=lambda config: {"block_size": 32})})
    with pytest.raises(PluginConflictError, match=r"plugins 'a_plugin' and 'b_plugin' both override 'block_size' \(16 vs 32\)"):
        collect_config_overrides(manager, {})


def test_register_models_merges_and_a_clash_names_both_plugins():
    _, manager = manager_for({"mamba": plugin(register_models=lambda: {"MambaForCausalLM": "mamba_pkg:Mamba"}),
                              "rwkv": plugin(register_models=lambda: {"RwkvForCausalLM": "rwkv_pkg:Rwkv"})})
    models = collect_models(manager)
    assert {k: (c.value, c.plugin) for k, c in models.items()} == {
        "MambaForCausalLM": ("mamba_pkg:Mamba", "mamba"), "RwkvForCausalLM": ("rwkv_pkg:Rwkv", "rwkv")}

    _, manager = manager_for({"one": plugin(register_models=lambda: {"LlamaForCausalLM": "one:Llama"}),
                              "two": plugin(register_models=lambda: {"LlamaForCausalLM": "two:Llama"})})
    with pytest.raises(PluginConflictError, match="'LlamaForCausalLM' is registered by both 'one' .* and 'two'"):
        collect_models(manager)


def test_a_plugin_with_an_unknown_hook_or_bad_signature_fails_at_discovery():
    registry, manager = manager_for({
        "typo": plugin(configur=lambda config: {}),
        "badargs": plugin(configure=lambda cfg: {}),
        "fine": plugin(on_engine_stop=lambda: None),
    })
    status = {r.name: r for r in registry.records("plugin")}
    assert status["typo"].status is PluginStatus.FAILED and "unknown hook 'configur'" in status["typo"].reason
    assert status["badargs"].status is PluginStatus.FAILED and "cfg" in status["badargs"].reason
    assert status["fine"].available
    assert [name for name, _ in manager.list_name_plugin()] == ["fine"]


def test_blocked_and_incompatible_plugins_are_not_registered():
    future = plugin(on_engine_stop=lambda: None)
    future.api_version = (3, 0)
    registry, manager = manager_for({"future": future, "metrics": plugin(on_engine_stop=lambda: None),
                                     "other": plugin(on_engine_stop=lambda: None)}, policy="-metrics")
    status = {r.name: r.status for r in registry.records("plugin")}
    assert status == {"future": PluginStatus.INCOMPATIBLE, "metrics": PluginStatus.BLOCKED, "other": PluginStatus.AVAILABLE}
    assert [name for name, _ in manager.list_name_plugin()] == ["other"]


def test_builtins_are_registered_first_under_their_module_names():
    registry = PluginRegistry.make_test_instance(include_core=False)
    manager = build_plugin_manager(registry, builtins=["tokenmill.cli.env_command"])
    assert manager.has_plugin("tokenmill.cli.env_command")


def test_one_module_behind_two_entry_points_is_registered_once():
    shared = plugin(on_engine_stop=lambda: None)
    _, manager = manager_for({"first": shared, "second": shared})
    assert [name for name, _ in manager.list_name_plugin()] == ["first"]
