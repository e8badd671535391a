"""``tokenmill plugins``: every installed plugin with its status, and the platform that would be
chosen; ``tokenmill plugins explain`` (see explain_command) dry-runs the whole selection. The listing
exits 1 when any plugin failed or was refused for its API version (the table is printed first)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tokenmill.cli import explain_command
from tokenmill.cli.table import render_table, shorten
from tokenmill.discovery import PluginRecord, PluginRegistry, SelectionError, select_platform
from tokenmill.discovery.record import BROKEN
from tokenmill.plugin_api import hookimpl

HEADERS = ("KIND", "NAME", "DISTRIBUTION", "VERSION", "API", "STATUS", "REASON")
REASON_WIDTH = 72


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``plugins`` (alias ``plugins list``) and ``plugins explain``."""
    parser = subparsers.add_parser("plugins", help="list installed plugins and explain selection",
                                   description="List installed plugins, their status and the platform that would "
                                               "be chosen.")
    _add_list_arguments(parser)
    parser.set_defaults(func=run_list)
    actions = parser.add_subparsers(dest="plugins_command", metavar="ACTION")
    listing = actions.add_parser("list", help="list installed plugins (the default)")
    _add_list_arguments(listing)
    listing.set_defaults(func=run_list)
    explain_command.add_parser(actions)


def _add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="show the choice under this pin (NAME or NAME:INDEX)")
    parser.add_argument("--allow-cpu-fallback", action="store_true",
                        help="treat broken platform plugins as warnings when showing the choice")
    parser.add_argument("-v", "--verbose", action="store_true", help="full reasons and tracebacks")


def _row(record: PluginRecord, chosen: bool, verbose: bool) -> tuple[str, ...]:
    api = ".".join(map(str, record.api_version)) if record.api_version else "-"
    reason = "; ".join(record.reasons) if verbose else shorten(record.reason, REASON_WIDTH)
    name = f"{record.name} *" if chosen else record.name
    return (record.kind, name, record.distribution or record.entry_point, record.version or "-", api,
            record.status.value, reason or "-")


def plugin_listing(registry: PluginRegistry, device: str | None = None, allow_cpu_fallback: bool = False,
                   verbose: bool = False) -> str:
    """The text of ``tokenmill plugins``."""
    chosen, outcome = None, ""
    try:
        choice = select_platform(registry, device, allow_cpu_fallback)
        chosen = choice.record
        outcome = f"* would be chosen: platform {choice.name}, device {choice.device_index} (score {choice.score})"
    except SelectionError as error:
        message = str(error) if verbose else str(error).splitlines()[0]
        outcome = f"no platform would be chosen: {message}" + ("" if verbose else "\n  (--verbose shows why in full)")
    records = registry.all_records()
    lines = [render_table(HEADERS, [_row(r, r is chosen, verbose) for r in records]), "", outcome]
    lines += [f"warning: {w}" for w in registry.warnings]
    if verbose:
        for record in records:
            if record.traceback:
                lines += ["", f"{record.kind} '{record.name}' traceback:", record.traceback.rstrip()]
    return "\n".join(lines)


def run_list(args: argparse.Namespace) -> int:
    """Print the plugin table; 1 when a plugin is broken (failed, or refused for its API version)."""
    print(plugin_listing(args.registry, args.device, args.allow_cpu_fallback, args.verbose))
    broken = [r for r in args.registry.all_records() if r.status in BROKEN]
    if broken:
        listed = ", ".join(f"{r.kind.replace('_', ' ')} '{r.name}' ({r.status.value})" for r in broken)
        print(f"error: {len(broken)} plugin{'s' if len(broken) > 1 else ''} cannot be used: {listed}", file=sys.stderr)
        return 1
    return 0
