"""Exit codes and argument types of ``pplan``, and the settings ``pplan serve``'s flags make, each
within the bounds the ``PPLAN_*`` variables have."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from api.settings import Settings

EXIT_OK = 0
EXIT_OUTPUT = 1
"""The answer could not be written (standard output closed, full or gone: a pipe's reader left),
or the system refused a resource the command needs (files, processes)."""


class OutputError(Exception):
    """Writing the answer failed (the ``OSError`` it wraps says why): exit ``EXIT_OUTPUT``."""


EXIT_INVALID = 2
EXIT_INFEASIBLE = 3
EXIT_NO_ANSWER = 4
"""No plan within the search's time limit (``plan``), or no point planned (``sweep``)."""

MAX_SWEEP_WORKERS = 256
"""Most processes ``pplan sweep --workers`` starts (a sweep has at most max_sweep_points points)."""


class FlagError(ValueError):
    """A command-line flag outside its bounds (exit code 2)."""


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse exits 2 with the message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def sweep_workers(text: str) -> int:
    """An argparse type: ``positive_int`` up to ``MAX_SWEEP_WORKERS``."""
    value = positive_int(text)
    if value > MAX_SWEEP_WORKERS:
        raise argparse.ArgumentTypeError(f"{value} is above {MAX_SWEEP_WORKERS}")
    return value


def serve_settings(host: str | None, port: int | None, workers: int | None) -> Settings:
    """``Settings`` with ``pplan serve``'s flags over the ``PPLAN_*`` variables, the flags held to
    the same bounds (``FlagError`` names the flag; a bad variable raises ``ValidationError``)."""
    flags: dict[str, Any] = {k: v for k, v in (("host", host), ("port", port), ("workers", workers)) if v is not None}
    try:
        return Settings(**flags)
    except ValidationError as exc:
        bad = [e for e in exc.errors() if e["loc"] and e["loc"][0] in flags]
        if not bad:
            raise
        raise FlagError("; ".join(f"--{e['loc'][0]} {flags[str(e['loc'][0])]}: {e['msg']}" for e in bad)) from None


def write_output(text: str) -> None:
    """Write ``text`` to standard output and flush it; ``OutputError`` when that fails."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        raise OutputError(exc.strerror or str(exc)) from exc
