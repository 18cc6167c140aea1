"""GitHub Actions workflow commands and environment files.

Everything here is a no-op or a plain print outside Actions, so commands can call it freely.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


def in_actions() -> bool:
    """True inside a GitHub Actions (or act) job."""
    return os.environ.get("GITHUB_ACTIONS") == "true"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotate(level: str, message: str, title: str | None = None) -> None:
    """Print an `::error::` / `::warning::` / `::notice::` line inside Actions.

    Annotations go to stderr (the runner reads workflow commands from both streams) so that
    stdout stays clean for `--json` documents.
    """
    if not in_actions():
        return
    props = f" title={_escape_property(title)}" if title else ""
    print(f"::{level}{props}::{_escape_data(message)}", file=sys.stderr, flush=True)


def say(level: str, message: str) -> None:
    """One line on stderr: an annotation inside Actions, `fxcache: LEVEL: ...` elsewhere."""
    if in_actions():
        annotate(level, f"fxcache: {message}")
    else:
        print(f"fxcache: {level}: {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """A warning: one line on stderr, an annotation inside Actions."""
    say("warning", message)


def mask(value: str) -> None:
    """Ask the runner to hide a secret in all later log output (on stderr, like every
    workflow command here, so that a `--json` document on stdout stays parseable)."""
    if not in_actions():
        return
    for line in value.splitlines():  # one command per line: a newline would end it early
        if line.strip():  # escaped as the runner reads it back: a '%25' in it stays '%25'
            print(f"::add-mask::{_escape_data(line)}", file=sys.stderr, flush=True)


def _is_log(stream: TextIO) -> bool:
    """Does `stream` go to the job's log (a pipe or terminal), not into a file?"""
    try:
        return not stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # io.StringIO and friends: not a log
        return False


def print_untrusted(text: str, file: TextIO | None = None) -> None:
    """Print text that comes from documents or logs (reasons, log tails, runner names): inside
    Actions, when the stream is the job's log, between `::stop-commands::TOKEN` and
    `::TOKEN::` (a fresh random token), so that no line of it is read as a workflow command
    (`::add-mask::`, `::set-output`, `::error::`, the older `##[...]` form). Output into a
    file, or text that holds neither form, is left as it is."""
    stream = file if file is not None else sys.stdout
    plain = "::" not in text and "##[" not in text  # no line can be a command (v2 or v1 form)
    if plain or not (in_actions() and _is_log(stream)):
        stream.write(text)
        stream.flush()
        return
    token = os.urandom(16).hex()
    body = text if text.endswith("\n") or not text else text + "\n"
    stream.write(f"::stop-commands::{token}\n{body}::{token}::\n")
    stream.flush()


@contextlib.contextmanager
def group(title: str) -> Iterator[None]:
    """Fold the enclosed output into a collapsible group inside Actions."""
    active = in_actions()
    if active:
        print(f"::group::{_escape_data(title)}", flush=True)
    try:
        yield
    finally:
        if active:
            print("::endgroup::", flush=True)


_FILE_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _append_file_var(env_name: str, name: str, value: str) -> bool:
    """Append `name` = `value` in the multi-line form with a random delimiter, so that no value
    (newlines, `=`, `<<`, an attacker's text) can end it early or inject another variable."""
    path = os.environ.get(env_name)
    if not path:
        return False
    if not _FILE_VAR_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid name for ${env_name}")
    delimiter = f"fxcache_{os.urandom(16).hex()}"
    while delimiter in value:  # never in practice; then no value can contain it
        delimiter = f"fxcache_{os.urandom(16).hex()}"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
    return True


def set_output(name: str, value: str) -> bool:
    """Write a step output to `$GITHUB_OUTPUT`; False when there is none."""
    return _append_file_var("GITHUB_OUTPUT", name, value)


def export_env(name: str, value: str) -> bool:
    """Export a variable to later steps through `$GITHUB_ENV`; False when there is none."""
    return _append_file_var("GITHUB_ENV", name, value)


def save_state(name: str, value: str) -> bool:
    """Keep a value for this action's post step (`$GITHUB_STATE`; the runner hands it to the
    post step as STATE_<name>); False when there is none."""
    return _append_file_var("GITHUB_STATE", name, value)


def append_summary(markdown: str) -> bool:
    """Append markdown to the job summary (`$GITHUB_STEP_SUMMARY`); False when there is none."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return True
