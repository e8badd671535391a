"""``tokenmill serve`` and ``tokenmill bench serve`` as registered through the plugin hook, and the
server flags."""

import argparse

import pytest

from tokenmill.cli.builtin_commands import BUILTIN_COMMAND_MODULES
from tokenmill.cli.engine_flags import engine_args_from
from tokenmill.cli.main import build_parser
from tokenmill.discovery import build_plugin_manager, discover
from tokenmill_server import bench
from tokenmill_server.bench.bench_command import add_parser as add_bench_parser
from tokenmill_server.bench.serve_load import percentiles
from tokenmill_server.server_args import api_keys, settings_from


@pytest.fixture(scope="module")
def parser():
    parser, warnings = build_parser(build_plugin_manager(discover(), BUILTIN_COMMAND_MODULES))
    assert not [w for w in warnings if "server" in w]
    return parser


def test_serve_is_registered_with_engine_and_server_flags(parser):
    args = parser.parse_args(["serve", "model.gguf", "--max-num-seqs", "7", "--no-enable-prefix-caching", "--port",
                              "9000", "--api-key", "a,b", "--api-key", "c", "--max-body-size", "2MiB",
                              "--max-waiting-requests", "-1", "--shutdown-timeout", "3"])
    engine = engine_args_from(args, model=args.model)
    assert (engine.model, engine.max_num_seqs, engine.enable_prefix_caching) == ("model.gguf", 7, False)
    settings = settings_from(args)
    assert settings.port == 9000 and settings.host == "127.0.0.1"
    assert settings.api_keys[:3] == ("a", "b", "c")
    assert settings.max_body_bytes == 2 << 20 and settings.max_waiting_requests is None
    assert settings.shutdown_timeout == 3.0
    defaults = settings_from(parser.parse_args(["serve"]))
    assert defaults.port == 8000 and defaults.max_waiting_requests == 1024 and defaults.grpc_port is None


def test_auto_tool_choice_flags(parser):
    settings = settings_from(parser.parse_args(["serve", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]))
    assert settings.tool_call_parser == "hermes" and settings.request_limits().tool_call_parser == "hermes"
    assert settings_from(parser.parse_args(["serve", "--tool-call-parser", "hermes"])).tool_call_parser is None
    assert settings_from(parser.parse_args(["serve"])).request_limits().tool_call_parser is None
    with pytest.raises(ValueError, match="--tool-call-parser"):
        settings_from(parser.parse_args(["serve", "--enable-auto-tool-choice"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--tool-call-parser", "nope"])


def test_special_tokens_in_content_are_text_unless_allowed(parser):
    assert settings_from(parser.parse_args(["serve"])).allow_special_tokens_in_content is False
    allowed = settings_from(parser.parse_args(["serve", "--allow-special-tokens-in-content"]))
    assert allowed.allow_special_tokens_in_content is True


def test_api_keys_merge_flags_and_environment():
    assert api_keys(["x, y", "x"], {"TOKENMILL_API_KEY": "z,,y"}) == ("x", "y", "z")
    assert api_keys(None, {}) == ()


def test_bench_serve_joins_an_existing_bench_command(parser):
    args = parser.parse_args(["bench", "serve", "--num-prompts", "3", "--input-len", "8", "--output-len", "2"])
    assert (args.num_prompts, args.input_len, args.output_len) == (3, 8, 2)
    assert args.func.__module__ == "tokenmill_server.bench.bench_command"


def test_bench_serve_creates_bench_when_nobody_did():
    root = argparse.ArgumentParser()
    subparsers = root.add_subparsers()
    add_bench_parser(subparsers)
    assert root.parse_args(["bench", "serve", "--max-concurrency", "4"]).max_concurrency == 4
    assert bench.__doc__


def test_percentiles():
    report = percentiles([0.001 * i for i in range(1, 101)])
    assert report["p50"] == pytest.approx(51.0) and report["p99"] == pytest.approx(99.0)
    assert percentiles([]) == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
