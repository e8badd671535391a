"""pluggy hook specifications: lifecycle and registration hooks for general plugins.

A plugin module (or object) registered under the entry-point group ``tokenmill.plugins``
implements any subset of these with ``@hookimpl``. Every hook must be safe to call more than once
(the CLI, the API server and the engine each load plugins in their own process).
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT_NAME = "tokenmill"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_models() -> dict[str, str]:
    """Return {Hugging Face architecture name: "module:Class"} for model implementations this
    plugin provides. Called once per process when the model registry is first used. Later plugins
    cannot silently replace an architecture: a clash is an error naming both."""


@hookspec
def register_commands(subparsers: Any) -> None:
    """Add subcommands to the ``tokenmill`` CLI: ``subparsers`` is argparse's sub-parser action.
    Each added parser must set ``func=callable(args) -> int | None`` as its default.
    Called in the CLI process before arguments are parsed."""


@hookspec
def register_routes(app: Any, engine: Any) -> None:
    """Add routes to the server's FastAPI ``app``; ``engine`` is the async engine client.
    Called in the API-server process after the built-in routes are added."""


@hookspec
def configure(config: dict[str, Any]) -> dict[str, Any] | None:
    """Return overrides for the engine configuration (a read-only view is passed; do not mutate
    it). Called once while the configuration is resolved; every override is reported with the
    plugin's name. Two plugins overriding one field differently is an error."""


@hookspec
def on_engine_start(engine_info: dict[str, Any]) -> None:
    """Called in the engine process once the model is loaded and the KV cache allocated.
    ``engine_info`` holds the platform, model, dtype and cache size."""


@hookspec
def on_engine_stop() -> None:
    """Called in the engine process when the engine shuts down (also after errors)."""


@hookspec
def on_request_finished(request_id: str, finish_reason: str | None, num_prompt_tokens: int, num_output_tokens: int) -> None:
    """Called in the engine process after a request finished or was aborted. Must be fast:
    it runs inside the engine loop."""
