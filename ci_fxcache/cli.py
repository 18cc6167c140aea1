"""The `fxcache` command line: argument parsing, dispatch, errors and exit codes.

Exit codes: 0 ok, 1 a check failed, 2 a usage or input error, 128 + the signal when interrupted
(130 SIGINT, 143 SIGTERM). Errors are one line on stderr (plus an `::error::` annotation inside
Actions); `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ci_fxcache import __version__, gha
from ci_fxcache.errors import EXIT_USAGE, FxcacheError

# One module per subcommand under ci_fxcache.commands; each has register(subparsers, parent),
# which declares the options and sets `func`: the command's function, whose keyword-only
# parameters are the options' dests, or, where it also sets `request` (a frozen dataclass, as
# `verify` does), whose one argument is that request built from them: its fields are the dests
# (tests/test_cli_signatures.py holds them to it).
# Modules must stay cheap to import: heavy imports (requests, jinja2) go inside functions.
COMMANDS: tuple[str, ...] = (
    "fingerprint",
    "key",
    "plan",
    "restore",
    "verify",
    "save",
    "invalidate",
    "report",
    "merge",
    "comment",
    "stats",
    "action",
)
# What the parsed namespace holds for dispatch itself; everything else is the command's options.
DISPATCH_DESTS = ("command", "func", "request", "debug")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that says what to do, and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _report_error(f"{message} (see '{self.prog} --help')")
        sys.exit(EXIT_USAGE)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """An unknown command names only the commands `--help` lists (hidden ones, such as
        the action's `action`, stay hidden), and the closest of them."""
        if not isinstance(action, argparse._SubParsersAction) or value in (action.choices or {}):
            super()._check_value(action, value)
            return
        shown = visible_commands(action)
        close = difflib.get_close_matches(str(value), shown, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise argparse.ArgumentError(
            action,
            f"invalid choice: {value!r} (choose from {', '.join(map(repr, shown))}){hint}",
        )


def visible_commands(action: argparse.Action) -> list[str]:
    """The subcommands `--help` lists: those registered with a help text."""
    return [a.dest for a in getattr(action, "_choices_actions", [])]


def _report_error(message: str) -> None:
    gha.say("error", message)


def report_failure(message: str) -> None:
    """A failed check: one line on stderr, plus an `::error::` annotation inside Actions."""
    _report_error(message)


def common_options() -> argparse.ArgumentParser:
    """Options every subcommand accepts (after the subcommand name)."""
    parent = _Parser(add_help=False)
    parent.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks for errors",
    )
    return parent


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand registered, or just `only` (what `main` runs: a
    restore then imports only what restore needs)."""
    parser = _Parser(
        prog="fxcache",
        description=(
            "Keep torch.compile caches alive between CI jobs, scoped by torch / CUDA / triton / "
            "Python / GPU architecture, and verify that hot loads are safe before trusting them."
        ),
    )
    parser.add_argument("--version", action="version", version=f"fxcache {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parent = common_options()
    for name in COMMANDS if only is None else (only,):
        module = importlib.import_module(f"ci_fxcache.commands.{name}")
        module.register(sub, parent)
    return parser


# Commands that leave nothing to the interpreter's teardown (no atexit work, no child to join,
# every file closed): the executable ends them with os._exit once its output is flushed, which
# saves the ~15 ms of module finalization on every job's critical path (docs/store.md).
QUICK_EXIT = ("restore",)


def _command(args_in: Sequence[str]) -> str | None:
    """The subcommand named in `args_in`, if any."""
    first = next((arg for arg in args_in if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


def entry() -> None:
    """The `fxcache` executable (and `python -m ci_fxcache`): `main`, then exit."""
    code = main()
    if _command(sys.argv[1:]) in QUICK_EXIT:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command (`argv`: default sys.argv[1:]); its exit code."""
    args_in = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command(args_in))
    args = parser.parse_args(args_in)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    debug = bool(getattr(args, "debug", False)) or os.environ.get("FXCACHE_DEBUG") == "1"
    command = args.func
    options = {k: v for k, v in vars(args).items() if k not in DISPATCH_DESTS}
    request = getattr(args, "request", None)
    try:
        if request is not None:
            return int(command(request(**options)) or 0)
        return int(command(**options) or 0)
    except FxcacheError as exc:
        if debug:
            import traceback  # only here: every command starts without it

            traceback.print_exc()
        _report_error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt as exc:  # errors.Interrupted too (SIGTERM inside verify)
        signum = getattr(exc, "signum", signal.SIGINT)
        _report_error(f"interrupted ({signal.Signals(signum).name})")
        return 128 + signum
    except BrokenPipeError:
        return 0
