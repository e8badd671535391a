"""The tokenmill CLI: built-in commands, commands added by plugins through register_commands,
and the installed console script."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tokenmill.cli.main import main, version_line
from tokenmill.plugin_api import PLUGIN_API_VERSION, DeviceInfo, Platform, PlatformCapabilities, ProbeResult, hookimpl

API = ".".join(map(str, PLUGIN_API_VERSION))


class SimulatedGpu(Platform):
    name = "gpu"
    device_type = "cuda"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(100, ("2 simulated GPUs",), (DeviceInfo(0, "sim 0", 80 * 2**30),))

    @property
    def capabilities(self):
        return PlatformCapabilities(dtypes=("float32",))


class AbsentNpu(SimulatedGpu):
    name = "npu"
    device_type = "npu"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(0, ("no NPU driver found",))


class BrokenXpu(SimulatedGpu):
    name = "xpu"
    device_type = "xpu"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        raise RuntimeError("level-zero loader crashed")


def registry(*platforms, plugins=()):
    from tokenmill.discovery import PluginRegistry

    return PluginRegistry.make_test_instance(platforms=platforms or (SimulatedGpu, AbsentNpu), plugins=plugins)


def command_plugin(name, func=None, fail=None):
    def register_commands(subparsers):
        if fail:
            raise fail
        parser = subparsers.add_parser(name, help=f"the {name} command")
        parser.add_argument("--times", type=int, default=1)
        parser.set_defaults(func=func)

    return SimpleNamespace(api_version=(2, 0), register_commands=hookimpl(register_commands))


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"], registry=registry())
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == version_line()
    assert version_line().startswith(f"tokenmill 0.1.0 (plugin API {API}")


def test_no_command_prints_help(capsys):
    assert main([], registry=registry()) == 2
    out = capsys.readouterr().out
    assert "plugins" in out and "env" in out


def test_plugins_lists_every_kind_and_marks_the_choice(capsys):
    assert main(["plugins"], registry=registry()) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "API", "STATUS", "REASON"]
    gpu = next(line for line in lines if line.startswith("platform") and " gpu *" in line)
    assert "in-memory-test" in gpu and API in gpu and "available" in gpu and "2 simulated GPUs" in gpu
    npu = next(line for line in lines if " npu " in line)
    assert "unavailable" in npu and "no NPU driver found" in npu
    assert any(line.startswith("attention_backend") and " reference " in line and "tokenmill" in line for line in lines)
    assert any(line.startswith("quantizer") and " unquantized " in line for line in lines)
    assert "* would be chosen: platform gpu, device 0 (score 100)" in out


def test_plugins_shows_why_nothing_would_be_chosen_and_exits_1_for_a_broken_plugin(capsys):
    assert main(["plugins"], registry=registry(SimulatedGpu, BrokenXpu)) == 1
    captured = capsys.readouterr()
    assert captured.err == "error: 1 plugin cannot be used: platform 'xpu' (failed)\n"
    out = captured.out
    assert "failed" in out and "probe() raised RuntimeError: level-zero loader crashed" in out
    assert "no platform would be chosen: platform plugin 'xpu'" in out and "--verbose" in out
    assert "Traceback" not in out

    assert main(["plugins", "list", "--verbose"], registry=registry(SimulatedGpu, BrokenXpu)) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().out

    assert main(["plugins", "--allow-cpu-fallback"], registry=registry(SimulatedGpu, BrokenXpu)) == 1
    assert "* would be chosen: platform gpu" in capsys.readouterr().out


def test_explain_prints_the_report_and_errors_exit_1(tmp_path, capsys):
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 100, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plugins", "explain", "--model", str(tmp_path), "--device", "reference"], registry=registry()) == 0
    out = capsys.readouterr().out
    assert f"model: {tmp_path} (config from config.json)" in out
    assert "platform: reference (cpu" in out and "pinned by --device reference" in out
    assert "attention backend for full attention layers: reference" in out
    assert "quantization: " in out and "lm_head" in out

    code = main(["plugins", "explain", "--model", str(tmp_path), "--device", "reference",
                 "--attention-backend", "nonexistent"], registry=registry())
    assert code == 1
    assert "error: --attention-backend nonexistent cannot serve this model" in capsys.readouterr().err


def test_explain_without_model_explains_the_bundled_model_as_generate_runs_it(capsys):
    from tokenmill.benchmarks.default_model import BUNDLED_GGUF, bundled_model_path

    assert main(["plugins", "explain"]) == 0  # the installed plugins, as `tokenmill generate` sees them
    out = capsys.readouterr().out
    assert f"model: {bundled_model_path()} (config from " in out and BUNDLED_GGUF in out
    assert "quantization: gguf" in out


def test_env_reports_versions_and_probes(capsys):
    assert main(["env"], registry=registry()) == 0
    out = capsys.readouterr().out
    for expected in ("python: 3.", f"plugin API: {API}", "torch: ", "triton: ", "transformers: ", "TOKENMILL_DEVICE: ",
                     "gpu (in-memory-test): score 100", "device 0: sim 0, 80.0 GiB", "npu (in-memory-test): score 0",
                     "no NPU driver found"):
        assert expected in out


def test_a_plugin_adds_a_command_that_main_dispatches(capsys):
    calls = []

    def run(args):
        calls.append((args.times, args.registry is not None, args.plugin_manager is not None))
        return 3

    assert main(["serve", "--times", "2"], registry=registry(plugins={"server": command_plugin("serve", run)})) == 3
    assert calls == [(2, True, True)]


def test_a_plugin_reusing_a_command_name_is_reported_and_core_keeps_it(capsys):
    hijack = command_plugin("plugins", lambda args: 99)
    assert main(["plugins"], registry=registry(plugins={"hijack": hijack})) == 0
    captured = capsys.readouterr()
    assert ("plugin 'hijack' tried to add command 'plugins', which 'tokenmill.cli.plugins_command' already provides"
            in captured.err)
    assert "KIND" in captured.out


def test_a_plugin_whose_register_commands_raises_does_not_break_the_cli(capsys):
    broken = command_plugin("bench", fail=RuntimeError("bench needs torch.compile"))
    assert main(["env"], registry=registry(plugins={"broken": broken})) == 0
    assert "plugin 'broken' failed to add its commands: RuntimeError: bench needs torch.compile" in capsys.readouterr().err


def test_installed_console_script_runs():
    script = Path(sys.executable).with_name("tokenmill")
    env = {**os.environ, "TOKENMILL_PLUGINS": "reference"}
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("tokenmill ")
    listing = subprocess.run([str(script), "plugins"], capture_output=True, text=True, env=env, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "* would be chosen: platform reference" in listing.stdout
