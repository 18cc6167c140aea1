"""The figures of one job from its trace records: lookups, hits, misses, bypasses, recompiles,
graph breaks, compile seconds. Every string kept is cut short; the figures are plain JSON."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ci_fxcache.jobstats.trace import Record
from ci_fxcache.worker import keylines

VALUE_CHARS = 80  # a component's value as the scope records it and the report shows it
REASON_CHARS = 200
REASONS_SHOWN = 5


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value == value else 0.0


def _compile_id(head: dict[str, Any]) -> str | None:
    frame, attempt = head.get("frame_id"), head.get("frame_compile_id")
    if isinstance(frame, int) and isinstance(attempt, int):
        return f"{frame}/{attempt}"
    return None


def _lookup(record: Record, kind: tuple[str, str]) -> dict[str, Any]:
    try:
        info = json.loads(record.payload or "{}")
    except (ValueError, RecursionError):
        info = {}
    info = info if isinstance(info, dict) else {}
    key = info.get("key")
    cold = info.get("time_taken_ns") if kind[1] == "miss" else info.get("time_saved_ns")
    lookup: dict[str, Any] = {
        "cache": kind[0],
        "state": kind[1],
        "key": str(key)[:64] if isinstance(key, str) else None,
        "process": record.process,
        "pid": record.pid,
        "rank": record.head.get("rank") if isinstance(record.head.get("rank"), int) else None,
        "compile_id": _compile_id(record.head),
        "cold_ns": int(_number(cold)),
        "at_ns": int(_number(info.get("cache_event_time"))),
    }
    if kind[0] == "fxgraph":
        lines = info.get("components")
        lookup["components"] = keylines.parse_components(
            lines if isinstance(lines, list) else [], VALUE_CHARS
        )
    detailed = info.get("cache_status_detailed")
    if kind == ("aotautograd", "miss") and detailed == "hit":
        # torch 2.15 with `_sync_cache_decision_cross_ranks`: this rank found its entry and
        # dropped it because another rank missed (`autograd_cache_cross_rank_miss`).
        lookup["cross_rank"] = True
    reason = keylines.bypass_reason(info)
    if kind[1] == "bypass":
        lookup["bypass_reason"] = reason or "torch gave no reason"
    return lookup


def lookups(records: list[Record]) -> list[dict[str, Any]]:
    """Every cache lookup, in the order the job's processes made them (torch's lookup time;
    a lookup without one keeps its place after the previous one of its process)."""
    out: list[tuple[int, int, dict[str, Any]]] = []
    last: dict[str, int] = {}
    for record in records:
        artifact = record.head.get("artifact")
        name = artifact.get("name") if isinstance(artifact, dict) else None
        kind = keylines.lookup_kind(name) if isinstance(name, str) else None
        if kind is not None and kind[1] in keylines.STATES:
            lookup = _lookup(record, kind)
            last[record.process] = lookup["at_ns"] or last.get(record.process, 0)
            out.append((last[record.process], len(out), lookup))
    return [lookup for *_, lookup in sorted(out, key=lambda x: (x[0], x[1]))]


def _short(text: Any) -> str:
    return " ".join(str(text).split())[:REASON_CHARS]


def _top(reasons: list[str]) -> list[dict[str, Any]]:
    return [{"reason": r, "count": n} for r, n in Counter(reasons).most_common(REASONS_SHOWN)]


def _break_reason(payload: str) -> str:
    """Where (file name and line) and why, from torch's graph-break text."""
    where, why = "", ""
    for line in payload.splitlines():
        text = line.strip()
        if text.startswith("Graph break in user code at ") and not where:
            where = text.removeprefix("Graph break in user code at ").rsplit("/", 1)[-1]
        elif text.startswith("Explanation:") and not why:
            why = text.removeprefix("Explanation:")
        elif text.startswith("Graph Break Reason:") and not why:
            why = text.removeprefix("Graph Break Reason:")
    return _short(f"{where}: {why.strip()}" if where else why.strip() or "unknown")


CPP_BUILD = "compile_file"  # Inductor's timed C++ build (a kernel or its wrapper), torch 2.13


def cpp_builds(records: list[Record]) -> int:
    """C++ builds torch timed (`compile_file` begin events): a hot load that hit builds none."""
    builds = 0
    for record in records:
        if "chromium_event" in record.head and f'"{CPP_BUILD}"' in record.payload:
            try:
                event = json.loads(record.payload)
            except (ValueError, RecursionError):
                continue
            if (
                isinstance(event, dict)
                and event.get("name") == CPP_BUILD
                and event.get("ph") == "B"
            ):
                builds += 1
    return builds


def frame_seconds(records: list[Record]) -> dict[tuple[str, str], float]:
    """(process, compile id) -> the seconds torch spent compiling (or loading) that frame,
    forward and backward."""
    out: dict[tuple[str, str], float] = {}
    for record in records:
        for name, field in (
            ("compilation_metrics", "entire_frame_compile_time_s"),
            ("bwd_compilation_metrics", "inductor_compile_time_s"),
        ):
            metrics = record.head.get(name)
            if isinstance(metrics, dict) and isinstance(metrics.get("compile_id"), str):
                where = (record.process, metrics["compile_id"][:40])
                out[where] = out.get(where, 0.0) + _number(metrics.get(field))
    return out


PROCESSES_SHOWN = 64


def by_process(records: list[Record], found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per process (its trace file): its rank, FX graph hits and misses, compile seconds; the
    first PROCESSES_SHOWN in the order of their files."""
    seconds: dict[str, float] = {}
    for (process, _), spent in frame_seconds(records).items():
        seconds[process] = seconds.get(process, 0.0) + spent
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.process not in rows and len(rows) < PROCESSES_SHOWN:
            spent = round(seconds.get(record.process, 0.0), 3)
            rows[record.process] = {
                "process": record.process[:120], "rank": None, "hit": 0, "miss": 0,
                "compile_s": spent,
            }  # fmt: skip
    for x in found:
        row = rows.get(x["process"])
        if row is None:
            continue
        if x["rank"] is not None:
            row["rank"] = x["rank"]
        if x["cache"] == "fxgraph" and x["state"] in ("hit", "miss"):
            row[x["state"]] += 1
    return list(rows.values())


def figures(records: list[Record], found: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over the job's records and lookups (`found`: lookups(records))."""
    caches = {c: {s: 0 for s in keylines.STATES} for c in keylines.ARTIFACTS.values()}
    for lookup in found:
        caches[lookup["cache"]][lookup["state"]] += 1
    frames, recompiles, breaks, failures = 0, [], [], []
    for record in records:
        metrics = record.head.get("compilation_metrics")
        if isinstance(metrics, dict):
            frames += 1
            if metrics.get("recompile_reason"):
                recompiles.append(_short(metrics["recompile_reason"]))
            if metrics.get("fail_type"):
                failures.append(_short(f"{metrics['fail_type']}: {metrics.get('fail_reason')}"))
        artifact = record.head.get("artifact")
        if isinstance(artifact, dict) and artifact.get("name") == "dynamo_graph_break_reason":
            breaks.append(_break_reason(record.payload))
    ranks = sorted({x["rank"] for x in found if x["rank"] is not None})
    return {
        "processes": len({r.process for r in records}),
        "ranks": ranks[:PROCESSES_SHOWN],
        "by_process": by_process(records, found),
        "cross_rank_misses": sum(1 for x in found if x.get("cross_rank")),
        "graphs": sum(caches["fxgraph"].values()),
        "fxgraph": caches["fxgraph"],
        "aotautograd": caches["aotautograd"],
        "bypass_reasons": _top([x["bypass_reason"] for x in found if "bypass_reason" in x]),
        "frames": frames,
        "recompiles": {"count": len(recompiles), "reasons": _top(recompiles)},
        "graph_breaks": {"count": len(breaks), "reasons": _top(breaks)},
        "failures": {"count": len(failures), "reasons": _top(failures)},
        "compile_s": round(sum(frame_seconds(records).values()), 3),
        "cpp_builds": cpp_builds(records),
    }
