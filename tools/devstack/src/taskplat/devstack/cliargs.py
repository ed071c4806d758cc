"""What every command line of the tools shares: argument types and the run of a parsed command.

`python -m taskplat.devstack` (the local runtime), `python -m taskplat.bench`, `python -m
taskplat.chaos` and `python -m taskplat.soak` all parse with these types and run through `run`.

Invariants:
- A bad value is an argparse usage error (exit 2) naming the value, before anything starts.
- `run` turns a `DevstackError` into one line, ``<prog>: error: ...`` on stderr, and exit 1;
  Ctrl-C is exit 130; never a traceback for an expected failure.
- Log lines go to stderr, prefixed with the command's name.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from taskplat.devstack.errors import DevstackError


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 1-65535: {value}")
    return value


def usable_dir(path: Path) -> Path:
    """`path` made absolute and created; a `DevstackError` when it cannot be a directory."""
    path = path.absolute()
    if path.exists() and not path.is_dir():
        raise DevstackError(f"--dir {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DevstackError(f"cannot create --dir {path}: {exc.strerror or exc}") from exc
    return path


def share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share is between 0 and 1, not {value}")
    return value


def seconds_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of seconds: {text!r}") from None
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"seconds must be positive: {text!r}")
    return values


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def positive(text: str) -> int:
    value = count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None, name: str) -> int:
    """Parse `argv`, then call the parsed `func(args)`; its exit code, or 1 on a DevstackError."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"{name}: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except DevstackError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
