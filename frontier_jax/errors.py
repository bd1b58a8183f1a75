"""One error base for expected failures and one exit-code table, shared by every entry point.

An expected failure is something the user can fix: a bad setting, a missing or corrupt file, a full
disk, a run directory owned by another process. Entry points wrap their body in `exit_on_error`,
which turns such a failure into one line on stderr (naming the file or setting) and the exit code
below; anything else is a bug and keeps its traceback. This module imports nothing from the project
(it is a leaf layer: see the import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import sys

EXIT_OK = 0
EXIT_BUG = 1  # an unexpected exception (traceback kept)
EXIT_BAD_INPUT = 2  # bad input or environment: one line, nothing half-written
EXIT_DIVERGED = 3  # the loss became non-finite; the last finite checkpoint is kept
EXIT_INTERRUPTED = 130  # SIGINT / SIGTERM: a resumable checkpoint was saved (or nothing was trained yet)


class BadInput(ValueError):
    """An expected failure: the message names the file or setting and the problem, in one line."""


class Diverged(RuntimeError):
    """The loss became non-finite."""


def describe_os_error(e: OSError) -> str:
    """One line for an OSError: the path, the errno's name (ENOSPC = disk full) and the message."""
    where = f"{e.filename}: " if getattr(e, "filename", None) else ""
    name = errno.errorcode.get(e.errno or 0, "")
    what = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return f"{where}{what}" + (f" ({name})" if name else "")


@contextlib.contextmanager
def exit_on_error():
    """Map expected failures to one stderr line and an exit code (raised as SystemExit).

    BadInput -> 2, OSError (I/O, permissions, disk full) -> 2, Diverged -> 3, KeyboardInterrupt -> 130.
    """
    try:
        yield
    except BadInput as e:
        _leave(f"error: {e}", EXIT_BAD_INPUT)
    except Diverged as e:
        _leave(f"error: {e}", EXIT_DIVERGED)
    except OSError as e:
        _leave(f"error: {describe_os_error(e)}", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        _leave("interrupted", EXIT_INTERRUPTED)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for every entry point: a bad option (missing, unknown, out of range: `int_in` and
    `float_in` below) is one line on stderr and exit 2, as every other bad input (argparse would print its
    usage first); `--help` gives the usage."""

    def error(self, message):
        _leave(f"error: {self.prog}: {message} (see --help)", EXIT_BAD_INPUT)


def int_in(lo: int, hi: int | None = None):
    """An argparse `type`: an integer in [lo, hi] (hi None: no upper bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value} is outside [{lo}, {'inf' if hi is None else hi}]")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float | None = None, lo_open: bool = False):
    """An argparse `type`: a finite number in [lo, hi] ((lo, hi] with lo_open; hi None: no upper bound)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value} is outside {'(' if lo_open else '['}{lo:g}, "
                                             f"{'inf' if hi is None else f'{hi:g}'}] (a finite number)")
        return value

    parse.__name__ = "number"
    return parse


def _leave(line: str, code: int):
    print(line.splitlines()[0] if line else line, file=sys.stderr, flush=True)
    raise SystemExit(code)
