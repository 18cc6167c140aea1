"""Exceptions that map to the CLI's exit codes."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class FxcacheError(Exception):
    """Base class: carries the exit code and a one-line message for the user."""

    exit_code = EXIT_USAGE


class UsageError(FxcacheError):
    """Bad flags, bad input files, an interpreter without torch: exit 2."""

    exit_code = EXIT_USAGE


class CheckFailed(FxcacheError):
    """A check ran and failed (probe mismatch, unsafe combination): exit 1."""

    exit_code = EXIT_CHECK_FAILED


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived (see `signals_interrupt`): the command stops its children and
    `cli.main` exits 128 + `signum` (130, 143), as a shell reports a process a signal ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within (a `with` block or a decorated function): SIGINT and SIGTERM raise `Interrupted`
    in the main thread, so that `finally` blocks stop children and remove temporary files
    (SIGTERM would otherwise end the process at once, saying nothing). Outside the main thread
    signals cannot be handled: nothing changes."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
