"""tokenmill-server's plugin module (entry point group ``tokenmill.plugins``): adds ``tokenmill
serve`` and ``tokenmill bench serve`` to the CLI. Importing it stays cheap."""

from __future__ import annotations

from typing import Any

from tokenmill.plugin_api import hookimpl

api_version = (2, 0)  # the plugin API this module is built against; discovery refuses a hook module without one


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``serve``, and ``serve`` under ``bench`` (creating ``bench`` if no one has yet)."""
    from tokenmill_server import serve_command
    from tokenmill_server.bench import bench_command

    serve_command.add_parser(subparsers)
    bench_command.add_parser(subparsers)
