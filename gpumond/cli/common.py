"""What every command's parser shares: argparse that refuses a bad flag in one line, and the argument types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line that says what to do (exit 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see: {self.prog} --help)\n")


def whole_number(lo: int, hi: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from lo to hi, refused in one line that says the range (and why)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}{why}, got {v}")
        return v

    return parse


def speed(text: str) -> float:
    """An argparse type: a positive number up to 100,000 (a speed-up, a duration)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < v <= 100_000:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 100000, got {v:g}")
    return v


def directory(text: str) -> Path:
    """--state-dir: made absolute here, from the directory the command runs in (the config wants it absolute
    because a daemon's working directory under systemd is /)."""
    if not text.strip():
        raise ValueError("must be a directory path")
    return Path(text).expanduser().absolute()


def innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser `args` were parsed by, e.g. the one of `gpumond remediation undo`."""
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public walk of its subparsers
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return innermost(action.choices[getattr(args, action.dest)], args)
    return parser
