"""A job's figures (`fxcache-stats/1`) read back from a file, checked before any report shows
them: `fxcache comment --job-stats FILE`, and the figures file the save keeps, which the
action's post step hands to the same code. Such a file is anyone's to write (a fork's job
wrote its trace; the file sits in the runner's temporary directory), as a results document is.

The check keeps the document's shape (so that fields a newer fxcache adds still reach the
renderer) but bounds it, and types what the renderer prints as it is: every count and time is
a number (anything else becomes 0), every other leaf a bounded string, number, bool or null.
Strings are escaped where they are shown (report/render.py: `md_text`, `html_text`).
"""

from __future__ import annotations

from typing import Any

from ci_fxcache.jobstats import history
from ci_fxcache.jobstats.job import SCHEMA
from ci_fxcache.jobstats.numbers import number

MAX_DEPTH = 8
MAX_ITEMS = 1000  # per list
MAX_KEYS = 200  # per object
MAX_TEXT = 2000  # characters per string
# Fields that hold a number wherever they appear, and objects all of whose values are numbers
# (not `rank` or `slowest_rank`: null there means "no rank", which 0 would turn into rank 0).
NUMBERS = frozenset(
    {"graphs", "frames", "processes", "cpp_builds", "compile_s", "saved_s", "hit", "miss",
     "bypass", "count", "changed_count", "files", "bytes", "records", "skipped_lines",
     "cold_ns", "hits", "bypasses", "seconds", "s", "pid", "saved_sum_s",
     "untraced_entries", "cross_rank_misses", "total_s", "per_process_s"}
)  # fmt: skip
NUMBER_MAPS = frozenset({"fxgraph", "aotautograd", "miss_causes", "misses_by_cause"})


def _leaf(value: Any, numeric: bool) -> Any:
    if numeric:
        return number(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return number(value)
    return str(value)[:MAX_TEXT] if isinstance(value, str) else None


def _walk(value: Any, key: str, numeric: bool, depth: int) -> Any:
    numeric = numeric or key in NUMBERS
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return {}
        inner = key in NUMBER_MAPS
        return {
            str(k)[:MAX_TEXT]: _walk(v, str(k), inner, depth + 1)
            for k, v in list(value.items())[:MAX_KEYS]
        }
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            return []
        return [_walk(v, key, numeric, depth + 1) for v in value[:MAX_ITEMS]]
    return _leaf(value, numeric)


def checked(doc: Any) -> dict[str, Any] | None:
    """The figures, typed and bounded (None when `doc` is not a figures document); the history
    rows as history.checked reads them (a row dated in the future goes)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    out: dict[str, Any] = _walk(doc, "", False, 0)
    raw_rows = doc.get("history")
    found = raw_rows[-history.ROWS :] if isinstance(raw_rows, list) else []
    out["history"] = [r for r in (history.checked(x) for x in found) if r is not None]
    return out
