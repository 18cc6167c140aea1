"""Exceptions that map to the CLI's exit codes."""

from __future__ import annotations

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
