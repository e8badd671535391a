"""The startup report says where the compute dtype came from: the user's --dtype, the default of the
platform (or a plugin) for a user who left it "auto", or the checkpoint."""

import pytest
from transformers import LlamaConfig

from tokenmill.config import EngineArgs
from tokenmill.discovery import SelectionError, resolve_dtype
from tokenmill.engine_core.config_resolver import resolve_config
from tokenmill.plugin_api import PlatformCapabilities

CAPS = PlatformCapabilities(dtypes=("bfloat16", "float32"))


def test_resolve_dtype_names_who_set_it():
    assert resolve_dtype("bfloat16", "float32", CAPS) == ("bfloat16", "requested with --dtype")
    assert resolve_dtype("bfloat16", "float32", CAPS, "platform cpu") == ("bfloat16", "default from platform cpu")
    assert resolve_dtype("auto", "float32", CAPS) == ("float32", "the checkpoint's dtype")
    with pytest.raises(SelectionError, match=r"^dtype float16 \(default from plugin tuner\): the platform computes "
                                             r"bfloat16, float32$"):
        resolve_dtype("float16", None, CAPS, "plugin tuner")


@pytest.fixture(scope="module")
def float32_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("float32-llama")
    LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, torch_dtype="float32").to_json_file(
        directory / "config.json")
    return str(directory)


def _dtype_line(config):
    return next(line for line in config.render_report().splitlines() if line.startswith("dtype: "))


def test_the_report_tells_a_platform_default_from_a_request(float32_checkpoint):
    on_cpu = resolve_config(EngineArgs(model=float32_checkpoint, device="cpu", kv_cache_memory="8MiB"))
    assert _dtype_line(on_cpu) == f"dtype: {on_cpu.model.dtype} (default from platform cpu)"
    requested = resolve_config(EngineArgs(model=float32_checkpoint, device="cpu", kv_cache_memory="8MiB",
                                          dtype="float32"))
    assert _dtype_line(requested) == "dtype: float32 (requested with --dtype)"
    on_reference = resolve_config(EngineArgs(model=float32_checkpoint, device="reference", kv_cache_memory="8MiB"))
    assert _dtype_line(on_reference) == "dtype: float32 (the checkpoint's dtype)"
