"""Naming rules for values that become file names, artifact names, markers or cache keys.

Each rule lives here once; the command line's options (`commands/options.py`) and the action's
input validation call them, so a bad value gets the same one-line error everywhere.
"""

from __future__ import annotations

import re

from ci_fxcache.errors import UsageError

_REPORT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEY_SUFFIX = re.compile(r"[A-Za-z0-9._+-]{1,64}")


def check_report_id(value: str) -> str:
    """A report id: 1-64 letters, digits, '.', '_' or '-' (it names files and artifacts)."""
    if not _REPORT_ID.fullmatch(value) or value in (".", ".."):
        raise UsageError(f"invalid report id {value!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return value


def check_key_suffix(value: str) -> str:
    """A cache-key suffix: 1-64 letters, digits, '.', '_', '+' or '-'.

    A comma breaks actions/cache's key lists and a '/' makes keys that
    `fxcache invalidate --github` cannot parse back into a scope.
    """
    if not _KEY_SUFFIX.fullmatch(value):
        raise UsageError(
            f"invalid key suffix {value!r}: use 1-64 letters, digits, '.', '_', '+' or '-' "
            "(no ',' or '/')"
        )
    return value
