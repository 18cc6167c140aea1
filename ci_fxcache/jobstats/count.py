"""The figures of one job from its trace records: lookups, hits, misses, bypasses, recompiles,
graph breaks, compile seconds, where the compile time went. Records are taken one at a time
(`Tally.add`) and only what is counted is kept: per lookup a few numbers, per key its components
once (a job's keys share nearly all of them: kept as one base and each key's own), reasons
counted by text with a bounded number of distinct ones. Every string kept is cut short; the
figures are plain JSON."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ci_fxcache.jobstats import phases
from ci_fxcache.jobstats.numbers import number
from ci_fxcache.jobstats.trace import Event, Record
from ci_fxcache.worker import keylines

VALUE_CHARS = 80  # a component's value as the scope records it and the report shows it
REASON_CHARS = 200
REASONS_SHOWN = 5
REASONS_KEPT = 1000  # distinct reasons counted per kind; more are counted as "other"
KEYS_KEPT = 20_000  # keys whose components are kept; a lookup past it has none
PROCESSES_SHOWN = 64
LINE_CACHED, LINES_CACHED = 400, 50_000  # component lines parsed once: their length, number
CPP_BUILD = "compile_file"  # Inductor's timed C++ build (a kernel or its wrapper), torch 2.13
_KEY = re.compile(r'"key": "([^"\\]{1,128})"')


def _compile_id(head: dict[str, Any]) -> str | None:
    frame, attempt = head.get("frame_id"), head.get("frame_compile_id")
    if isinstance(frame, int) and isinstance(attempt, int):
        return f"{frame}/{attempt}"
    return None


class Components(Mapping[str, list[Any]]):
    """One key's components: the job's base (the first key's) with this key's own values and
    the base names it lacks. Read like a dict; shared by every lookup of the key."""

    __slots__ = ("_base", "_len", "_missing", "_own")

    def __init__(self, base: dict[str, list[Any]], full: dict[str, list[Any]]) -> None:
        self._base = base
        self._own = {n: v for n, v in full.items() if base.get(n) != v}
        self._missing = frozenset(n for n in base if n not in full)
        self._len = len(full)

    def __getitem__(self, name: str) -> list[Any]:
        if name in self._own:
            return self._own[name]
        if name in self._missing:
            raise KeyError(name)
        return self._base[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._own
        yield from (n for n in self._base if n not in self._own and n not in self._missing)

    def __len__(self) -> int:
        return self._len


def _short(text: Any) -> str:
    return " ".join(str(text).split())[:REASON_CHARS]


class _Reasons:
    """Reasons counted by text, at most REASONS_KEPT distinct ones."""

    def __init__(self) -> None:
        self.count = 0
        self.by_text: Counter[str] = Counter()

    def add(self, reason: str) -> None:
        self.count += 1
        if reason in self.by_text or len(self.by_text) < REASONS_KEPT:
            self.by_text[reason] += 1
        else:
            self.by_text["(other reasons)"] += 1

    def top(self) -> list[dict[str, Any]]:
        return [{"reason": r, "count": n} for r, n in self.by_text.most_common(REASONS_SHOWN)]


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


class Tally:
    """What the figures need of a job's records, taken one record at a time."""

    def __init__(self) -> None:
        self._lookups: list[tuple[int, int, dict[str, Any]]] = []
        self._last: dict[str, int] = {}
        self._base: dict[str, list[Any]] | None = None
        self._components: dict[str, Components] = {}
        self._lines: dict[str, tuple[str, list[Any]]] = {}
        self.processes: dict[str, None] = {}  # in the order first seen
        self.frame_seconds: dict[tuple[str, str], float] = {}
        self.frames = 0
        self.cpp_builds = 0
        self.recompiles, self.breaks, self.failures = _Reasons(), _Reasons(), _Reasons()
        self.bypasses = _Reasons()
        self.phases = phases.Phases()

    def add(self, record: Record | Event) -> None:
        """Count one record."""
        self.processes.setdefault(record.process)
        if isinstance(record, Event):  # most records
            if record.name == CPP_BUILD and record.ph == "B":
                self.cpp_builds += 1
            self.phases.timed(record.process, record.name, record.ph, record.ts)
            return
        head = record.head
        artifact = head.get("artifact")
        name = artifact.get("name") if isinstance(artifact, dict) else None
        kind = keylines.lookup_kind(name) if isinstance(name, str) else None
        if kind is not None and kind[1] in keylines.STATES:
            self._lookup(record, kind)
        elif name == "dynamo_graph_break_reason":
            self.breaks.add(_break_reason(record.payload))
        for which, field in (
            ("compilation_metrics", "entire_frame_compile_time_s"),
            ("bwd_compilation_metrics", "inductor_compile_time_s"),
        ):
            metrics = head.get(which)
            if isinstance(metrics, dict):
                self._metrics(record.process, which, metrics, field)

    def _metrics(self, process: str, which: str, metrics: dict[str, Any], field: str) -> None:
        if isinstance(metrics.get("compile_id"), str):
            where = (process, metrics["compile_id"][:40])
            spent = float(number(metrics.get(field)))
            self.frame_seconds[where] = self.frame_seconds.get(where, 0.0) + spent
        if which != "compilation_metrics":
            return
        self.frames += 1
        if metrics.get("recompile_reason"):
            self.recompiles.add(_short(metrics["recompile_reason"]))
        if metrics.get("fail_type"):
            self.failures.add(_short(f"{metrics['fail_type']}: {metrics.get('fail_reason')}"))

    def _components_of(self, key: str | None, info: dict[str, Any]) -> Mapping[str, list[Any]]:
        if key is not None and key in self._components:
            return self._components[key]
        lines = info.get("components")
        full = self._parse(lines if isinstance(lines, list) else [])
        if key is None or len(self._components) >= KEYS_KEPT:
            return full if key is None else {}
        if self._base is None:
            self._base = full
        self._components[key] = Components(self._base, full)
        return self._components[key]

    def _parse(self, lines: list[Any]) -> dict[str, list[Any]]:
        """keylines.parse_components, each distinct short line parsed once (a job's keys share
        most of their lines: Inductor's settings, the system)."""
        out: dict[str, list[Any]] = {}
        for line in lines:
            if not isinstance(line, str):
                continue
            known = self._lines.get(line)
            if known is None:
                parsed = keylines.parse_components([line], VALUE_CHARS)
                known = next(iter(parsed.items()), None) or ("", [])
                if len(line) <= LINE_CACHED and len(self._lines) < LINES_CACHED:
                    self._lines[line] = known
            if known[0]:
                out[known[0]] = known[1]
        return out

    def _lookup(self, record: Record, kind: tuple[str, str]) -> None:
        payload = record.payload or "{}"
        known = _KEY.search(payload[:4096])
        if known and known[1] in self._components and kind[0] == "fxgraph":
            # A key already seen: its components are kept; decode nothing but the numbers.
            info = _numbers_only(payload)
        else:
            try:
                info = json.loads(payload)
            except (ValueError, RecursionError):
                info = {}
            info = info if isinstance(info, dict) else {}
        key = info.get("key") if isinstance(info.get("key"), str) else None
        if known and key is None:
            key = known[1]
        cold = info.get("time_taken_ns") if kind[1] == "miss" else info.get("time_saved_ns")
        rank = record.head.get("rank")
        lookup: dict[str, Any] = {
            "cache": kind[0],
            "state": kind[1],
            "key": key[:64] if key else None,
            "process": record.process,
            "pid": record.pid,
            "rank": rank if isinstance(rank, int) else None,
            "compile_id": _compile_id(record.head),
            "cold_ns": int(number(cold)),
            "at_ns": int(number(info.get("cache_event_time"))),
        }
        if kind[0] == "fxgraph":
            lookup["components"] = self._components_of(lookup["key"], info)
        if kind == ("aotautograd", "miss") and info.get("cache_status_detailed") == "hit":
            # torch 2.15 with `_sync_cache_decision_cross_ranks`: this rank found its entry and
            # dropped it because another rank missed (`autograd_cache_cross_rank_miss`).
            lookup["cross_rank"] = True
        if kind[1] == "bypass":
            reason = keylines.bypass_reason(info) or "torch gave no reason"
            lookup["bypass_reason"] = reason
            self.bypasses.add(reason)
        at = lookup["at_ns"] or self._last.get(record.process, 0)
        self._last[record.process] = at
        self._lookups.append((at, len(self._lookups), lookup))

    def lookups(self) -> list[dict[str, Any]]:
        """Every cache lookup, in the order the job's processes made them (torch's lookup time;
        a lookup without one keeps its place after the previous one of its process)."""
        return [x for *_, x in sorted(self._lookups, key=lambda x: (x[0], x[1]))]

    def figures(self, found: list[dict[str, Any]]) -> dict[str, Any]:
        """Counts over the job's records and lookups (`found`: self.lookups())."""
        caches = {c: {s: 0 for s in keylines.STATES} for c in keylines.ARTIFACTS.values()}
        for lookup in found:
            caches[lookup["cache"]][lookup["state"]] += 1
        ranks = sorted({x["rank"] for x in found if x["rank"] is not None})
        compiling = self.compiling(found)
        return {
            "processes": len(compiling),
            "ranks": ranks[:PROCESSES_SHOWN],
            "by_process": self.by_process(found),
            "cross_rank_misses": sum(1 for x in found if x.get("cross_rank")),
            "graphs": sum(caches["fxgraph"].values()),
            "fxgraph": caches["fxgraph"],
            "aotautograd": caches["aotautograd"],
            "bypass_reasons": self.bypasses.top(),
            "frames": self.frames,
            "recompiles": {"count": self.recompiles.count, "reasons": self.recompiles.top()},
            "graph_breaks": {"count": self.breaks.count, "reasons": self.breaks.top()},
            "failures": {"count": self.failures.count, "reasons": self.failures.top()},
            "compile_s": round(sum(self.frame_seconds.values()), 3),
            "cpp_builds": self.cpp_builds,
            "phases": self.phases.figures(ranks_of(found), compiling),
        }

    def compiling(self, found: list[dict[str, Any]]) -> list[str]:
        """The processes that compiled: a cache lookup or a Dynamo frame. Inductor's compile
        workers (a pool when compile threads > 1) write traces of their own builds: their
        time is inside their parent's, and they are not processes of the job."""
        did = {x["process"] for x in found} | {p for p, _ in self.frame_seconds}
        return [p for p in self.processes if p in did]

    def by_process(self, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Per process (its trace file): its rank, FX graph hits and misses, compile seconds;
        the first PROCESSES_SHOWN in the order they were read."""
        seconds: dict[str, float] = {}
        for (process, _), spent in self.frame_seconds.items():
            seconds[process] = seconds.get(process, 0.0) + spent
        rows: dict[str, dict[str, Any]] = {
            p: {"process": p[:120], "rank": None, "hit": 0, "miss": 0,
                "compile_s": round(seconds.get(p, 0.0), 3)}
            for p in self.compiling(found)[:PROCESSES_SHOWN]
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


_NUMBERS = re.compile(r'"(cache_event_time|time_taken_ns|time_saved_ns)": (\d{1,20})')


def _numbers_only(payload: str) -> dict[str, Any]:
    """The lookup's times, without decoding its components (a key whose components are kept)."""
    return {name: int(value) for name, value in _NUMBERS.findall(payload)}


def ranks_of(found: list[dict[str, Any]]) -> dict[str, int]:
    """process -> its rank, for the processes that had one."""
    return {x["process"]: x["rank"] for x in found if x["rank"] is not None}


def tally(records: Iterable[Record]) -> Tally:
    """Every record counted."""
    out = Tally()
    for record in records:
        out.add(record)
    return out


def lookups(records: Iterable[Record]) -> list[dict[str, Any]]:
    """Every cache lookup of `records`, in the order the job made them (Tally.lookups)."""
    return tally(records).lookups()


def figures(records: Iterable[Record], found: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over `records` and their lookups (Tally.figures)."""
    return tally(records).figures(found)


def frame_seconds(records: Iterable[Record]) -> dict[tuple[str, str], float]:
    """(process, compile id) -> the seconds torch spent compiling (or loading) that frame,
    forward and backward."""
    return tally(records).frame_seconds
