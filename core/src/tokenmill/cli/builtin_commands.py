"""Core's own CLI commands. Each module listed here implements the pluggy ``register_commands``
hook and is registered as a plugin under its module name, first, before any installed plugin.

To add a core command: write ``tokenmill/cli/<name>_command.py`` with
``@hookimpl def register_commands(subparsers)`` (adding a parser whose ``func`` default takes the
parsed ``args`` and returns an exit code) and add its module name below.
"""

BUILTIN_COMMAND_MODULES: tuple[str, ...] = (
    "tokenmill.cli.plugins_command",
    "tokenmill.cli.env_command",
    "tokenmill.cli.generate_command",
    "tokenmill.cli.bench_command",
    "tokenmill.cli.quantize_command",
    "tokenmill.cli.export_command",
)
