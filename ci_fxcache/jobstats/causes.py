"""Why each FX graph miss of the job missed, against the entries the scope recorded and those
the job itself made before it:

- entry gone: the scope (or this job) made an entry with this very key, and torch did not find
  it (evicted, invalidated, set aside);
- key changed: the scope holds an entry for the same traced graph whose key differs; the
  components whose hashes differ from the nearest such entry are named;
- new graph: the scope never saw this graph;
- compiled at once: another process of the job was compiling this very key when this lookup
  started (ranks of one torchrun job look the same keys up within milliseconds): not an entry
  that vanished, and not a setting that changed.

An entry a process of the job made counts as known only to lookups that started after it was
written (a miss's entry is written when its compile ends: torch's lookup time plus its compile
time; a hit proves the entry from its lookup on). Lookups without torch's lookup time keep the
order of their own process only.

Components that differ between any two processes of one job (a function's repr with its
address, such as `fx_kwargs[get_decomp_fn]`) are never named.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ci_fxcache.jobstats.records import graph_of
from ci_fxcache.verify.explain import component_name

NEW_GRAPH, KEY_CHANGED, ENTRY_GONE = "new graph", "key changed", "entry gone"
AT_ONCE = "compiled at once"
CAUSES = (NEW_GRAPH, KEY_CHANGED, ENTRY_GONE, AT_ONCE)
# Measured on torch 2.13: differs between two processes of one job (docs/job-stats.md).
PROCESS_SPECIFIC = frozenset({"fx_kwargs[get_decomp_fn]"})
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
CHANGES_SHOWN = 5
MISSES_SHOWN = 50


def process_specific(name: str, value: Any) -> bool:
    """A component that differs between processes whatever the job does."""
    return name in PROCESS_SPECIFIC or (isinstance(value, str) and bool(_ADDRESS.search(value)))


def differing(a: Mapping[str, list[Any]], b: Mapping[str, list[Any]]) -> list[str]:
    """Component names whose hashes differ (present on one side only included), the
    process-specific ones left out."""
    names = [n for n in a.keys() | b.keys() if (a.get(n) or [None])[0] != (b.get(n) or [None])[0]]
    kept = [n for n in names if not process_specific(n, (a.get(n) or b.get(n) or [None, None])[1])]
    return sorted(kept)


def _shown(pair: list[Any] | None) -> str | None:
    if not pair:
        return None
    return pair[1] if pair[1] is not None else f"hash {pair[0]}"


def _change(name: str, was: list[Any] | None, now: list[Any] | None) -> dict[str, Any]:
    return {
        "component": name,
        "label": component_name(name),
        "was": _shown(was),
        "now": _shown(now),
    }


@dataclass
class _Known:
    """The entries a lookup may have found: the scope's, and the job's own from when each was
    written; `pending` holds the job's compiles not yet finished at the lookup being explained."""

    entries: dict[str, dict[str, Any]]
    pending: list[tuple[int, int, str, str, dict[str, Any]]] = field(default_factory=list)
    by_graph: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _order: int = 0

    def __post_init__(self) -> None:
        for entry in self.entries.values():
            self.by_graph.setdefault(entry["graph"], []).append(entry)

    def add(self, written: int, key: str, process: str, entry: dict[str, Any]) -> None:
        """An entry the job wrote at `written` (ns)."""
        self._order += 1
        heapq.heappush(self.pending, (written, self._order, key, process, entry))

    def at(self, now: int) -> None:
        """Every entry written by `now` becomes known."""
        while self.pending and self.pending[0][0] <= now:
            _, _, key, _, entry = heapq.heappop(self.pending)
            if key not in self.entries:
                self.entries[key] = entry
                self.by_graph.setdefault(entry["graph"], []).append(entry)

    def compiling(self, key: str | None, process: str) -> set[str]:
        """Other processes whose compile of `key` had not finished."""
        return {p[3] for p in self.pending if p[2] == key and p[3] != process}


def explain(
    lookups: list[dict[str, Any]], recorded: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One cause per FX graph miss, in the order the job made them (`lookups` sorted by
    torch's lookup time, as count.lookups gives them)."""
    known = _Known(dict(recorded))
    out = []
    for lookup in lookups:
        if lookup["cache"] != "fxgraph":
            continue
        comps, key = lookup.get("components") or {}, lookup.get("key")
        now = int(lookup.get("at_ns") or 0)
        graph = graph_of(comps, key)
        known.at(now)
        if lookup["state"] == "miss":
            others = known.compiling(key, lookup["process"]) if key not in known.entries else set()
            cause = _cause(lookup, graph, comps, known)
            if others:
                cause = {**cause, "cause": AT_ONCE, "processes": len(others) + 1,
                         "changed": [], "changed_count": 0}  # fmt: skip
            out.append(cause)
        if key and lookup["state"] in ("miss", "hit"):
            entry = {"graph": graph, "cold_ns": lookup.get("cold_ns", 0), "components": comps}
            written = (
                now + int(lookup.get("cold_ns") or 0) if now and lookup["state"] == "miss" else now
            )
            known.add(written, key, lookup["process"], entry)
            if not now:  # no lookup time: known to what follows in the job's order
                known.at(0)
    return out


def _cause(
    lookup: dict[str, Any], graph: str, comps: Mapping[str, list[Any]], known: _Known
) -> dict[str, Any]:
    base = {
        "key": (lookup.get("key") or "")[:16],
        "graph": graph[:40],
        "process": lookup["process"],
        "rank": lookup.get("rank"),
    }
    if lookup.get("key") in known.entries:
        return {**base, "cause": ENTRY_GONE, "changed": []}
    same = [e for e in known.by_graph.get(graph, []) if e["components"]]
    if not same:
        return {**base, "cause": NEW_GRAPH, "changed": []}
    nearest = min(same, key=lambda e: len(differing(e["components"], comps)))
    names = differing(nearest["components"], comps)
    changed = [_change(n, nearest["components"].get(n), comps.get(n)) for n in names]
    return {**base, "cause": KEY_CHANGED, "changed": changed[:CHANGES_SHOWN],
            "changed_count": len(names)}  # fmt: skip


def by_cause(misses: list[dict[str, Any]]) -> dict[str, int]:
    """How many misses had each cause."""
    return {c: sum(1 for m in misses if m["cause"] == c) for c in CAUSES}
