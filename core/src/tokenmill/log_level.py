"""How much tokenmill logs (``--log-level``, passed to the engine process as ``TOKENMILL_LOG_LEVEL``),
and what a failure a user can cause looks like: one line naming the error, with its traceback only
at ``debug``."""

from __future__ import annotations

import argparse
import logging
import os

from tokenmill.discovery.selection_error import SelectionError

LOG_LEVEL_ENV = "TOKENMILL_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")
_SUMMARY_CHARS = 300  # a failure's line: long enough for a path and a reason, short enough to read


def add_log_level_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-level`` to a command that loads a model."""
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help=f"how much to log (default: info, or ${LOG_LEVEL_ENV}); debug also prints the "
                             f"traceback of a failure")


def current_log_level() -> str:
    """The level this process (and the engine process it starts) logs at."""
    level = os.environ.get(LOG_LEVEL_ENV, "info").lower()
    return level if level in LEVELS else "info"


def apply_log_level(level: str | None) -> str:
    """Set ``level`` (None: keep the environment's) for this process and its children; returns it."""
    if level is not None:
        os.environ[LOG_LEVEL_ENV] = level
    level = current_log_level()
    logging.getLogger("tokenmill").setLevel(level.upper())
    return level


def tracebacks_wanted() -> bool:
    """True at ``debug``: a failure is logged with its traceback, not only its line."""
    return current_log_level() == "debug"


def failure_summary(error: BaseException) -> str:
    """``Type: message`` on one line: the message's first line, cut to a readable length unless it is a
    SelectionError's (a setup problem's reason, written as one line and needed whole)."""
    text = str(error).strip()
    first = text.splitlines()[0].strip() if text else ""
    if len(first) > _SUMMARY_CHARS and not isinstance(error, SelectionError):
        first = first[:_SUMMARY_CHARS - 3].rstrip() + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
