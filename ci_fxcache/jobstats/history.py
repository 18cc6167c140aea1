"""The bounded per-scope history: one row per job that may write the scope, the newest ROWS.

Kept in two places, so that no job adds a file to the scope only for its row (a GitHub cache
entry or an S3 publish per job): a small file beside the scope in the local store root,
rewritten by every writing job, and a copy of the rows inside the record file a job commits
with the entries it added (records.py), which every tier carries with the scope. A runner that
restored the scope from a remote tier reads the rows from there.

The record files are listed by the scope's manifest, signed where the store is keyed; the local
file is written by whoever can write the store root. So a keyed job signs its local file too
(HMAC over the scope key and the rows) and reads only a local file with a valid signature:
nothing from an unsigned file reaches the record it signs and publishes. Every row read back is
checked field by field, and one whose time is not a time, or lies in the future (a planted
row dated 9999 would stay the newest for good), is dropped.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ci_fxcache import timestamps
from ci_fxcache.jobstats import records
from ci_fxcache.jobstats.numbers import number
from ci_fxcache.store import modes, trust

ROWS = 20
LOCAL_DIR = ".jobstats"  # under the store root, beside the scopes
MAX_LOCAL_BYTES = 1 << 20
LOCAL_SCHEMA = "fxcache-history/1"  # a signed local file; an unsigned one is a bare list
# How far ahead of this runner's clock a row may be dated (another runner's clock).
CLOCK_SKEW = timedelta(hours=1)


def row(doc: dict[str, Any]) -> dict[str, Any]:
    """A job's history row from its figures."""
    fx = doc.get("fxgraph") or {}
    return {
        "id": doc.get("job_id"),
        "at": doc.get("at"),
        "run": doc.get("run"),
        "graphs": doc.get("graphs", 0),
        "hits": fx.get("hit", 0),
        "misses": dict(doc.get("miss_causes") or {}),
        "bypasses": fx.get("bypass", 0),
        "compile_s": doc.get("compile_s", 0.0),
        "saved_s": doc.get("saved_s", 0.0),
    }


def _past(at: Any) -> bool:
    """Whether `at` is a time in the format rows are written in, not after now."""
    try:
        when = datetime.strptime(str(at), timestamps.FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return False
    return when <= datetime.now(UTC) + CLOCK_SKEW


def checked(raw: Any) -> dict[str, Any] | None:
    """A row read back, field by field (None when it is not one, or is dated in the future)."""
    if not isinstance(raw, dict) or not _past(raw.get("at")):
        return None
    raw_misses = raw.get("misses")
    misses: dict[str, Any] = raw_misses if isinstance(raw_misses, dict) else {}
    return {
        "id": str(raw.get("id"))[:32],
        "at": str(raw.get("at"))[:32],
        "run": str(raw["run"])[:24] if isinstance(raw.get("run"), str | int) else None,
        "graphs": int(number(raw.get("graphs"))),
        "hits": int(number(raw.get("hits"))),
        "misses": {str(k)[:32]: int(number(v)) for k, v in list(misses.items())[:8]},
        "bypasses": int(number(raw.get("bypasses"))),
        "compile_s": round(float(number(raw.get("compile_s"))), 3),
        "saved_s": round(float(number(raw.get("saved_s"))), 3),
    }


def _rows_in(raw: Any) -> list[dict[str, Any]]:
    found = raw if isinstance(raw, list) else []
    return [r for r in (checked(x) for x in found[-ROWS:]) if r is not None]


def local_file(root: Path, key: str) -> Path:
    """The local store's history file of scope `key`."""
    return root / LOCAL_DIR / f"{key}.json"


def _signed(key: str, rows_: list[dict[str, Any]], signing_key: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": LOCAL_SCHEMA, "scope_key": key, "rows": rows_}
    trust.sign(doc, signing_key)
    return doc


def _local(root: Path, key: str, signing_key: str | None) -> list[dict[str, Any]]:
    """The local file's rows; with a signing key, only from a file it signed for this scope."""
    path = local_file(root, key)
    try:
        if path.stat().st_size > MAX_LOCAL_BYTES:
            return []
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return []
    if isinstance(raw, dict) and raw.get("schema") == LOCAL_SCHEMA:
        if signing_key is not None and (
            raw.get("scope_key") != key or not trust.signed_with(raw, signing_key)
        ):
            return []
        return _rows_in(raw.get("rows"))
    return [] if signing_key is not None else _rows_in(raw)


def rows(
    root: Path,
    key: str,
    inductor_dir: Path | None,
    current: dict[str, Any] | None,
    signing_key: str | None = None,
) -> list[dict[str, Any]]:
    """The scope's last rows, oldest first (this job's last when given): the local file's and
    those the scope's record files carry, each job once. With `signing_key` (a keyed job,
    whose record file is signed), only a local file signed with it counts."""
    found: dict[str, dict[str, Any]] = {}
    paths = records.files(inductor_dir) if inductor_dir is not None else []
    for path in paths[-3:]:  # each carries the rows before it
        doc = records.load(path)
        for r in _rows_in((doc or {}).get("history")):
            found.setdefault(r["id"], r)
    for r in _local(root, key, signing_key):
        found[r["id"]] = r
    if current is not None:
        found[str(current["id"])] = current
    return sorted(found.values(), key=lambda r: str(r["at"]))[-ROWS:]


def save_local(
    root: Path, key: str, rows_: list[dict[str, Any]], signing_key: str | None = None
) -> None:
    """Rewrite the local history file (atomically; the last ROWS), under the store's modes:
    whatever the job's umask, nothing any other local user could write (a planted row); signed
    with `signing_key` when given."""
    modes.restrict_umask()
    path = local_file(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = rows_[-ROWS:]
    body: Any = kept if signing_key is None else _signed(key, kept, signing_key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body) + "\n", encoding="utf-8")
    os.replace(tmp, path)
