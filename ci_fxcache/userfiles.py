"""Reading the files and values a user hands to a command: one line and exit 2 when they are bad.

Every command reads user files (matrix files, results documents, cache state, templates) through
these helpers, so a missing, binary, non-UTF-8, truncated or absurdly nested file is a usage error
that names the file and the problem, never a traceback.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ci_fxcache import atomic_write
from ci_fxcache.errors import UsageError


def read_text(path: str | Path, label: str) -> str:
    """The UTF-8 text of `path`; `label` names it in the message (e.g. '--matrix-file F')."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{label}: is a directory, not a file")
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{label}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{label}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{label}: not UTF-8 text (byte {exc.start}); is it a binary file?"
        ) from None


def parse_json(text: str, label: str, parse_int: Callable[[str], Any] | None = None) -> Any:
    """Parsed JSON; a usage error for malformed or absurdly nested documents (`parse_int`:
    json's hook for integer literals; it may raise UsageError)."""
    try:
        return json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{label}: not valid JSON (line {exc.lineno}: {exc.msg}); was the file truncated?"
        ) from None
    except RecursionError:
        raise UsageError(f"{label}: nested too deeply to be a real document") from None


def parse_yaml(text: str, label: str) -> Any:
    """Parsed YAML (safe loader); a usage error for malformed or absurdly nested documents."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{label}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise UsageError(f"{label}: nested too deeply to be a real document") from None


def finite_number(text: str) -> float:
    """A finite number (`nan` and `inf` are usage errors)."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"{text!r} is not a finite number")
    return value


def duration_seconds(text: str) -> float:
    """A duration in seconds for a timeout: a finite number > 0 that a wait can take (`nan`,
    `inf`, 0, negative and absurdly long values are usage errors)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{text!r} is not a number of seconds > 0")
    if value > threading.TIMEOUT_MAX:
        raise UsageError(f"{text!r} seconds is longer than a wait can be: give a real limit")
    return value


def output_dir(path: str | Path, label: str) -> Path:
    """A directory the command may create or reuse; a usage error when a file is in the way."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{label}: {p} exists and is not a directory")
    return p


def output_file(path: str | Path, label: str, make_parents: bool = False) -> Path:
    """A file the command may write: a usage error when it is a directory, or when its folder
    is missing (unless `make_parents`) or is not a folder. Check before long work."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{label}: {p} is a directory; give a file name")
    for parent in (p.parent, *p.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{label}: {parent} is not a folder")
            break
        if not make_parents:
            raise UsageError(f"{label}: folder {p.parent} does not exist; create it first")
    return p


def write_output(path: str | Path, text: str, label: str, make_parents: bool = False) -> None:
    """Write a command's output file: atomically (a temporary file beside it, then a rename)
    when it is new or a regular file, else into it, as a shell redirection would
    (`atomic_write.write_output`); a usage error when it cannot be written (see `output_file`)."""
    p = output_file(path, label, make_parents)
    if make_parents:
        p.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write.write_output(p, text)
    except OSError as exc:
        raise UsageError(f"{label}: cannot write {p} ({exc.strerror})") from None
