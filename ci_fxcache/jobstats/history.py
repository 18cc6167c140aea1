"""The bounded per-scope history: one row per job that saved (its record file's `figures`),
the newest ROWS shown with this job's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ci_fxcache.jobstats import records

ROWS = 20


def row(doc: dict[str, Any]) -> dict[str, Any]:
    """A job's history row from its figures."""
    fx = doc.get("fxgraph") or {}
    return {
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


def _checked(raw: Any) -> dict[str, Any] | None:
    """A row from a record file, field by field (None when it is not one)."""
    if not isinstance(raw, dict):
        return None
    raw_misses = raw.get("misses")
    misses: dict[str, Any] = raw_misses if isinstance(raw_misses, dict) else {}
    return {
        "at": str(raw.get("at"))[:32],
        "graphs": int(_number(raw.get("graphs"))),
        "hits": int(_number(raw.get("hits"))),
        "misses": {str(k)[:32]: int(_number(v)) for k, v in list(misses.items())[:8]},
        "bypasses": int(_number(raw.get("bypasses"))),
        "compile_s": round(_number(raw.get("compile_s")), 3),
        "saved_s": round(_number(raw.get("saved_s")), 3),
    }


def rows(inductor_dir: Path, current: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The scope's last rows, oldest first, this job's last when given."""
    out = []
    for path in records.files(inductor_dir):
        doc = records.load(path)
        checked = _checked(doc.get("figures")) if doc else None
        if checked is not None:
            out.append(checked)
    if current is not None:
        out.append(current)
    return out[-ROWS:]
