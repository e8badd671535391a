"""A checkpoint whose files name a quantization format that no loaded quantizer claims is an error
naming the format, the distribution to install and why its quantizer is not loaded; it is never
loaded as unquantized. ``CheckpointFormat`` reads what the files say without any quantizer."""

import re
from importlib.metadata import EntryPoint

import pytest

from tokenmill.discovery import ModelDescription, PluginPolicy, PluginRegistry, SelectionError, select_quantizer
from tokenmill.discovery.checkpoint_format import CheckpointFormat
from tokenmill.plugin_api import Quantizer


def quantizer(name, confidence=0.0, api_version=(2, 0)):
    return type(f"{name.title()}Quantizer", (Quantizer,), {
        "name": name, "api_version": api_version, "detect": classmethod(lambda cls, config, path: confidence)})


def quantized(method, **settings):
    return {"quantization_config": {"quant_method": method, **settings}}


def compressed(storage=None, groups=()):
    config = {"quant_method": "compressed-tensors", "config_groups": {f"group_{i}": {"format": g}
                                                                      for i, g in enumerate(groups)}}
    if storage:
        config["format"] = storage
    return {"quantization_config": config}


@pytest.mark.parametrize(("hf_config", "name", "distribution"), [
    (quantized("gptq", bits=4), "gptq", "tokenmill-quant-gptq"),
    (quantized("gptq_v2"), "gptq_v2", "tokenmill-quant-gptq"),
    (quantized("AWQ"), "awq", "tokenmill-quant-awq"),
    (quantized("fp8"), "fp8", "tokenmill-quant-fp8"),
    (quantized("int8"), "int8", "tokenmill-quant-int8"),
    (compressed("pack-quantized"), "compressed-tensors pack-quantized", "tokenmill-quant-gptq"),
    (compressed("int-quantized"), "compressed-tensors int-quantized", "tokenmill-quant-int8"),
    (compressed("mixed-precision", groups=["float-quantized"]), "compressed-tensors float-quantized",
     "tokenmill-quant-fp8"),
    (compressed(groups=["int-quantized", "pack-quantized"]), "compressed-tensors", None),
    (quantized("bitsandbytes", load_in_4bit=True), "bitsandbytes", None),
])
def test_the_format_a_config_names(hf_config, name, distribution):
    declared = CheckpointFormat.read(hf_config, "/nonexistent")
    assert (declared.name, declared.distribution) == (name, distribution)


def test_gguf_headers_sidecar_files_and_plain_checkpoints(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    assert CheckpointFormat.read({}, str(tmp_path / "model.gguf")) == \
        CheckpointFormat("gguf", "gguf", "model.gguf has the GGUF header")
    assert CheckpointFormat.read({}, str(tmp_path)).family == "gguf"  # a directory holding one GGUF file
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert CheckpointFormat.read({"model_type": "llama", "torch_dtype": "bfloat16"}, str(plain)) is None
    assert CheckpointFormat.read({"quantization_config": {"gguf_mode": "packed"}}, str(plain)) is None
    (plain / "quantize_config.json").write_text('{"bits": 4}')
    assert CheckpointFormat.read({}, str(plain)) == \
        CheckpointFormat("gptq", "gptq", "quantize_config.json sits next to the weights")


def _error(registry, hf_config, model_path="/m"):
    with pytest.raises(SelectionError) as error:
        select_quantizer(registry, hf_config, model_path)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_blocked_quantizer_is_named_with_how_to_allow_it():
    registry = PluginRegistry.make_test_instance(quantizers=[quantizer("int8", 1.0)], policy="-int8")
    assert _error(registry, quantized("int8")) == (
        "the checkpoint is quantized as int8 (config.json's quantization_config.quant_method) and no loaded quantizer "
        "claims it, so it cannot be loaded (read as unquantized its output would be garbage): quantizer 'int8' "
        "(in-memory-test) is not loaded (blocked: denied by TOKENMILL_PLUGINS); allow it in TOKENMILL_PLUGINS")


def test_the_installed_int8_distribution_blocked_by_name():
    registry = PluginRegistry.from_installed(PluginPolicy.parse("-tokenmill-quant-int8"))
    message = _error(registry, compressed("int-quantized"))
    assert "quantized as compressed-tensors int-quantized (config.json's quantization_config)" in message
    assert re.search(r"quantizer 'int8' \(tokenmill-quant-int8 [\w.]+\) is not loaded \(blocked: denied by "
                     r"TOKENMILL_PLUGINS\); allow it in TOKENMILL_PLUGINS$", message), message


def test_an_uninstalled_format_names_the_distribution_to_install():
    registry = PluginRegistry.make_test_instance()  # core's own entries only
    assert _error(registry, compressed("pack-quantized")).endswith(
        ": install tokenmill-quant-gptq (pip install tokenmill-quant-gptq)")
    assert _error(registry, quantized("bitsandbytes")).endswith(
        ": tokenmill ships no quantizer for bitsandbytes; install a plugin that provides it")


def test_a_quantizer_refused_for_its_api_version_or_failing_to_import_is_named_with_its_reason(tmp_path, monkeypatch):
    future = quantizer("gptq", 1.0, api_version=(3, 0))
    assert "quantizer 'gptq' (in-memory-test) is not loaded (incompatible: quantizer plugin 'gptq' (in-memory-test) " \
           "was built for plugin API 3.0" in _error(PluginRegistry.make_test_instance(quantizers=[future]),
                                                    quantized("gptq"))
    (tmp_path / "tm_test_broken_awq.py").write_text("import tm_test_awq_kernels_that_do_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = EntryPoint("awq", "tm_test_broken_awq:AWQQuantizer", "tokenmill.quantizers")
    assert _error(PluginRegistry.make_test_instance(quantizers=[broken]), quantized("awq")).endswith(
        "quantizer 'awq' (tm_test_broken_awq:AWQQuantizer) is not loaded (failed: import failed: ModuleNotFoundError: "
        "No module named 'tm_test_awq_kernels_that_do_not_exist')")


def test_a_loaded_quantizer_that_declines_the_checkpoint_says_so():
    registry = PluginRegistry.make_test_instance(quantizers=[quantizer("fp8", 0.0)])
    assert _error(registry, quantized("fp8")).endswith(
        "quantizer 'fp8' (in-memory-test) does not recognise this checkpoint (its detect() gave 0)")


def test_a_gguf_file_nobody_reads_is_the_same_error_though_the_float_fallback_answers_every_file(tmp_path):
    checkpoint = tmp_path / "model.gguf"
    checkpoint.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(SelectionError, match=r"quantized as gguf \(model.gguf has the GGUF header\).*: install "
                                             r"tokenmill-quant-gguf \(pip install tokenmill-quant-gguf\)$"):
        ModelDescription.load(PluginRegistry.make_test_instance(), str(checkpoint))  # core's unquantized only
    blocked = PluginRegistry.from_installed(PluginPolicy.parse("-gguf"))
    with pytest.raises(SelectionError, match=r"quantizer 'gguf' \(tokenmill-quant-gguf [\w.]+\) is not loaded "
                                             r"\(blocked: denied by TOKENMILL_PLUGINS\); allow it in TOKENMILL_PLUGINS$"):
        ModelDescription.load(blocked, str(checkpoint))


def test_forcing_unquantized_on_a_quantized_checkpoint_is_noted():
    choice = select_quantizer(PluginRegistry.make_test_instance(), quantized("int8"), "/m", override="unquantized")
    assert choice.name == "unquantized" and choice.notes == [
        "--quantization unquantized: the checkpoint is quantized as int8 (config.json's quantization_config."
        "quant_method); its stored weights are read as they are"]


def test_a_plain_checkpoint_still_runs_unquantized():
    choice = select_quantizer(PluginRegistry.make_test_instance(quantizers=[quantizer("int8", 0.0)]),
                              {"model_type": "llama"}, "/m")
    assert choice.name == "unquantized"
