"""The bounded per-scope history: one row per job that may write the scope, the newest ROWS.

Kept in two places, so that no job adds a file to the scope only for its row (a GitHub cache
entry or an S3 publish per job): a small file beside the scope in the local store root,
rewritten by every writing job, and a copy of the rows inside the record file a job commits
with the entries it added (records.py), which every tier carries with the scope. A runner that
restored the scope from a remote tier reads the rows from there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ci_fxcache.jobstats import records
from ci_fxcache.store import modes

ROWS = 20
LOCAL_DIR = ".jobstats"  # under the store root, beside the scopes
MAX_LOCAL_BYTES = 1 << 20


def row(doc: dict[str, Any]) -> dict[str, Any]:
    """A job's history row from its figures."""
    fx = doc.get("fxgraph") or {}
    return {
        "id": doc.get("job_id"),
        "at": doc.get("at"),
        "graphs": doc.get("graphs", 0),
        "hits": fx.get("hit", 0),
        "misses": dict(doc.get("miss_causes") or {}),
        "bypasses": fx.get("bypass", 0),
        "compile_s": doc.get("compile_s", 0.0),
        "saved_s": doc.get("saved_s", 0.0),
    }


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value == value else 0.0


def checked(raw: Any) -> dict[str, Any] | None:
    """A row read back, field by field (None when it is not one)."""
    if not isinstance(raw, dict):
        return None
    raw_misses = raw.get("misses")
    misses: dict[str, Any] = raw_misses if isinstance(raw_misses, dict) else {}
    return {
        "id": str(raw.get("id"))[:32],
        "at": str(raw.get("at"))[:32],
        "graphs": int(_number(raw.get("graphs"))),
        "hits": int(_number(raw.get("hits"))),
        "misses": {str(k)[:32]: int(_number(v)) for k, v in list(misses.items())[:8]},
        "bypasses": int(_number(raw.get("bypasses"))),
        "compile_s": round(_number(raw.get("compile_s")), 3),
        "saved_s": round(_number(raw.get("saved_s")), 3),
    }


def _rows_in(raw: Any) -> list[dict[str, Any]]:
    found = raw if isinstance(raw, list) else []
    return [r for r in (checked(x) for x in found[-ROWS:]) if r is not None]


def local_file(root: Path, key: str) -> Path:
    """The local store's history file of scope `key`."""
    return root / LOCAL_DIR / f"{key}.json"


def _local(root: Path, key: str) -> list[dict[str, Any]]:
    path = local_file(root, key)
    try:
        if path.stat().st_size > MAX_LOCAL_BYTES:
            return []
        return _rows_in(json.loads(path.read_bytes()))
    except (OSError, ValueError, RecursionError):
        return []


def rows(
    root: Path, key: str, inductor_dir: Path | None, current: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The scope's last rows, oldest first (this job's last when given): the local file's and
    those the scope's record files carry, each job once."""
    found: dict[str, dict[str, Any]] = {}
    paths = records.files(inductor_dir) if inductor_dir is not None else []
    for path in paths[-3:]:  # each carries the rows before it
        doc = records.load(path)
        for r in _rows_in((doc or {}).get("history")):
            found.setdefault(r["id"], r)
    for r in _local(root, key):
        found[r["id"]] = r
    if current is not None:
        found[str(current["id"])] = current
    return sorted(found.values(), key=lambda r: str(r["at"]))[-ROWS:]


def save_local(root: Path, key: str, rows_: list[dict[str, Any]]) -> None:
    """Rewrite the local history file (atomically; the last ROWS), under the store's modes:
    whatever the job's umask, nothing any other local user could write (a planted row)."""
    modes.restrict_umask()
    path = local_file(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rows_[-ROWS:]) + "\n", encoding="utf-8")
    os.replace(tmp, path)
