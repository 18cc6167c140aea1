"""Command-line options that several commands accept, each declared once.

The rules behind them live outside the command line (`names`, `userfiles`, the store's
`layout` and `state_file`); this module only turns them into argparse options, so a bad value
is a one-line usage error (exit 2).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ci_fxcache import names, userfiles
from ci_fxcache.errors import UsageError

T = TypeVar("T")


def argument_type(check: Callable[[str], T], name: str) -> Callable[[str], T]:
    """An argparse `type=` from a checker that raises UsageError (its message is kept)."""

    def convert(text: str) -> T:
        try:
            return check(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name  # argparse names the type in some messages
    return convert


finite_float = argument_type(userfiles.finite_number, "number")
seconds = argument_type(userfiles.duration_seconds, "seconds")  # every timeout option


def report_id_option(parser: argparse.ArgumentParser, default: str | None, help: str) -> None:
    """`--report-id`: names files, artifacts and the sticky comment (checked by names)."""
    parser.add_argument(
        "--report-id",
        default=default,
        type=argument_type(names.check_report_id, "report id"),
        help=help,
    )


def python_option(parser: argparse.ArgumentParser) -> None:
    """`--python`: the interpreter whose torch is served (env FXCACHE_PYTHON)."""
    parser.add_argument(
        "--python",
        metavar="PATH",
        default=os.environ.get(names.PYTHON_ENV) or "python3",
        help="interpreter whose torch is served (env FXCACHE_PYTHON; default: python3 on PATH)",
    )


def redis_url_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--redis-url` (env FXCACHE_REDIS_URL, read where it is used: store.remote.redis_cache)."""
    parser.add_argument(
        "--redis-url", default=None, help=f"{help} (env FXCACHE_REDIS_URL; default: none)"
    )


def s3_url_option(parser: argparse.ArgumentParser) -> None:
    """`--s3-url s3://BUCKET/PREFIX` (env FXCACHE_S3_URL, read in store.remote.s3.client)."""
    parser.add_argument(
        "--s3-url",
        default=None,
        metavar="URL",
        help="bucket and prefix of the S3 tier, s3://BUCKET/PREFIX (env FXCACHE_S3_URL; "
        "default: none); endpoint, region and credentials come from the AWS variables",
    )


def salt_option(parser: argparse.ArgumentParser) -> None:
    """`--salt`: a user string mixed into the key (env FXCACHE_KEY_SALT)."""
    parser.add_argument(
        "--salt",
        default=None,
        help="user salt mixed into the scope key (env FXCACHE_KEY_SALT; default: none); "
        "change it to start a fresh cache",
    )


def root_option(parser: argparse.ArgumentParser) -> None:
    """`--root DIR`: the store root (store.layout.resolve_root applies the default)."""
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="store root (env FXCACHE_ROOT; default $RUNNER_TOOL_CACHE/fxcache inside Actions, "
        "~/.cache/fxcache elsewhere)",
    )


def state_file_option(parser: argparse.ArgumentParser) -> None:
    """`--state-file F`: where restore writes its state and save reads it (store.state_file)."""
    parser.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="restore's state (JSON); default: restore writes a new file (inside Actions "
        "$RUNNER_TEMP/fxcache-restore-state.json) and exports it as FXCACHE_STATE_FILE, which "
        "save reads",
    )
