"""``tokenmill serve [MODEL]``: the flags (core's engine flags, one per EngineArgs field, plus the
server's own) and the entry that runs the server. Heavy imports wait until the command runs."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from tokenmill.cli.engine_flags import add_engine_flags, engine_args_from
from tokenmill.log_level import add_log_level_flag, apply_log_level
from tokenmill_server.server_args import add_server_arguments, settings_from


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``tokenmill`` CLI."""
    parser = subparsers.add_parser(
        "serve", help="serve a model over OpenAI- and Anthropic-compatible HTTP (and gRPC)",
        description="Load MODEL and serve /v1/completions, /v1/chat/completions, /v1/messages and more. The port "
                    "opens once the model is loaded.")
    parser.add_argument("model", nargs="?", default=None,
                        help="model folder or .gguf file (default: the bundled SmolLM2-135M-Instruct GGUF)")
    add_engine_flags(parser)
    add_server_arguments(parser)
    add_log_level_flag(parser)
    parser.set_defaults(func=run)
    return parser


def configure_logging(level: str | None = None) -> None:
    """tokenmill's loggers to stderr at ``level`` (``--log-level``; default info)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    level = apply_log_level(level)
    for name in ("tokenmill", "tokenmill.server"):
        logging.getLogger(name).setLevel(level.upper())
    root = logging.getLogger("tokenmill")
    if not root.handlers:
        root.addHandler(handler)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    import asyncio

    from tokenmill.benchmarks.default_model import bundled_model_path
    from tokenmill_server.serve import serve

    configure_logging(args.log_level)
    try:
        model = args.model or bundled_model_path()
        engine_args = engine_args_from(args, model=model)
        settings = settings_from(args)
    except (FileNotFoundError, ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return asyncio.run(serve(engine_args, settings, getattr(args, "plugin_manager", None)))
