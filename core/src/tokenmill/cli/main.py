"""``tokenmill``: build the parser from every plugin's ``register_commands``, then dispatch.

Parsed ``args`` carry ``registry`` (the discovered ``PluginRegistry``) and ``plugin_manager`` so a
command never rediscovers. ``SelectionError`` from a command becomes one clear error and exit 1, and so
does any other exception (its type and first line; the traceback too at ``--log-level debug``).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

import pluggy

from tokenmill import __version__
from tokenmill.cli.builtin_commands import BUILTIN_COMMAND_MODULES
from tokenmill.discovery import PluginRegistry, SelectionError, build_plugin_manager, discover
from tokenmill.discovery.plugin_manager import call_each, ordered_hookimpls
from tokenmill.log_level import apply_log_level, failure_summary, tracebacks_wanted
from tokenmill.plugin_api import PLUGIN_API_VERSION


def version_line() -> str:
    """'tokenmill X.Y.Z (plugin API M.N, Python A.B.C)'."""
    api = ".".join(map(str, PLUGIN_API_VERSION))
    return f"tokenmill {__version__} (plugin API {api}, Python {sys.version.split()[0]})"


def add_commands(manager: pluggy.PluginManager, subparsers: argparse._SubParsersAction) -> list[str]:
    """Let each plugin add its subcommands, in registration order (core first). A plugin that
    raises or reuses a taken command name is reported, and the other plugins' commands stay."""
    warnings, owners = [], {}
    for impl in ordered_hookimpls(manager, "register_commands"):
        before = set(subparsers.choices)
        try:
            call_each(impl, subparsers=subparsers)
        except argparse.ArgumentError as error:
            taken = str(error).rsplit(":", 1)[-1].strip()
            holder = owners.get(taken, "another plugin")
            warnings.append(f"plugin '{impl.plugin_name}' tried to add command '{taken}', which '{holder}' already "
                            f"provides; that command was not replaced")
        except Exception as error:  # one broken plugin must not take the whole CLI down
            warnings.append(f"plugin '{impl.plugin_name}' failed to add its commands: {type(error).__name__}: {error}")
        for name in set(subparsers.choices) - before:
            owners[name] = impl.plugin_name
    return warnings


def build_parser(manager: pluggy.PluginManager) -> tuple[argparse.ArgumentParser, list[str]]:
    """The top-level parser with every plugin's subcommands, and warnings about plugins that
    could not add theirs."""
    parser = argparse.ArgumentParser(prog="tokenmill", description="A hardware-neutral LLM inference engine.")
    parser.add_argument("--version", action="version", version=version_line())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser, add_commands(manager, subparsers)


def main(argv: Sequence[str] | None = None, registry: PluginRegistry | None = None) -> int:
    """Entry point of the ``tokenmill`` console script; returns the exit code."""
    registry = registry if registry is not None else discover()
    manager = build_plugin_manager(registry, BUILTIN_COMMAND_MODULES)
    parser, warnings = build_parser(manager)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    args.registry, args.plugin_manager = registry, manager
    apply_log_level(getattr(args, "log_level", None))
    try:
        return int(args.func(args) or 0)
    except SelectionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # a bad model or argument: one line; the traceback at --log-level debug
        if tracebacks_wanted():
            traceback.print_exc()
        print(f"error: {failure_summary(error)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
