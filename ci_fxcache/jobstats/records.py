"""What the scope records of each FX graph entry its jobs made: the key components' hashes and
short values, the graph they belong to and its cold compile time, so that a later job can say
which component changed. Written as one file per saving job inside the scope's inductor
directory, so that it is committed, signed and carried by every tier with the rest of the scope;
a job that may not save never writes one.

A file holds the components common to all its entries once (`common`) and each entry's own
(`own`): the entries of one job share nearly every component.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SCHEMA = "fxcache-job-record/1"
RECORDS_DIR = "fxcache-jobs"  # under the scope's inductor directory
MAX_ENTRIES = 2000  # per file
MAX_COMPONENTS = 4000  # per entry
MAX_FILE_BYTES = 8 << 20
MAX_FILES_READ = 200  # the newest; a history row per file
GRAPH_COMPONENT = "gm"  # the traced FX graph: the same graph keeps its hash across runs


def graph_of(components: dict[str, list[Any]], key: str | None) -> str:
    """The identity of the graph a lookup is for: its traced graph's hash (the key itself when
    the trace did not carry it)."""
    gm = components.get(GRAPH_COMPONENT)
    return f"gm:{gm[0]}" if gm else f"key:{key}"


def encode(entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{key: {graph, cold_ns, components}} -> the file's compact form."""
    kept = dict(list(entries.items())[:MAX_ENTRIES])
    comps = [dict(list(e["components"].items())[:MAX_COMPONENTS]) for e in kept.values()]
    common: dict[str, list[Any]] = {}
    if comps:
        first = comps[0]
        common = {n: v for n, v in first.items() if all(c.get(n) == v for c in comps[1:])}
    return {
        "common": common,
        "entries": {
            key: {
                "graph": e["graph"],
                "cold_ns": int(e.get("cold_ns") or 0),
                "own": {n: v for n, v in c.items() if n not in common},
            }
            for (key, e), c in zip(kept.items(), comps, strict=True)
        },
    }


def _pair(value: Any) -> list[Any] | None:
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        shown = value[1] if isinstance(value[1], str) or value[1] is None else None
        return [value[0][:16], shown[:200] if isinstance(shown, str) else None]
    return None


def _components(raw: Any) -> dict[str, list[Any]]:
    if not isinstance(raw, dict):
        return {}
    out = {}
    for name, value in list(raw.items())[:MAX_COMPONENTS]:
        pair = _pair(value)
        if isinstance(name, str) and pair is not None:
            out[name[:200]] = pair
    return out


def decode(doc: Any) -> dict[str, dict[str, Any]]:
    """A record file's entries, checked field by field ({} for anything not ours)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return {}
    common = _components(doc.get("common"))
    entries = doc.get("entries")
    out: dict[str, dict[str, Any]] = {}
    for key, entry in list(entries.items() if isinstance(entries, dict) else [])[:MAX_ENTRIES]:
        if not isinstance(key, str) or not isinstance(entry, dict):
            continue
        cold = entry.get("cold_ns")
        out[key[:64]] = {
            "graph": str(entry.get("graph"))[:80],
            "cold_ns": cold if isinstance(cold, int) and cold >= 0 else 0,
            "components": {**common, **_components(entry.get("own"))},
        }
    return out


def record_dir(inductor_dir: Path) -> Path:
    """Where a scope's record files are, under the inductor directory the job got."""
    return inductor_dir / RECORDS_DIR


def files(inductor_dir: Path) -> list[Path]:
    """The record files, oldest first (names start with the UTC time), the newest
    MAX_FILES_READ."""
    try:
        entries = [e for e in os.scandir(record_dir(inductor_dir)) if e.name.endswith(".json")]
    except OSError:
        return []
    regular = sorted(e.name for e in entries if e.is_file(follow_symlinks=False))
    return [record_dir(inductor_dir) / n for n in regular[-MAX_FILES_READ:]]


def load(path: Path) -> dict[str, Any] | None:
    """One record file as JSON, or None when it is unreadable or too large."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def write(inductor_dir: Path, name: str, doc: dict[str, Any]) -> Path:
    """Write this job's record file (a new file: committed files never change)."""
    target = record_dir(inductor_dir) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"schema": SCHEMA, **doc}, sort_keys=True, separators=(",", ":"))
    tmp = target.with_name(f".{name}.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target
