"""Why each FX graph miss of the job missed, against the entries the scope recorded and those
the job itself made before it:

- entry gone: the scope (or this job) made an entry with this very key, and torch did not find
  it (evicted, invalidated, set aside);
- key changed: the scope holds an entry for the same traced graph whose key differs; the
  components whose hashes differ from the nearest such entry are named;
- new graph: the scope never saw this graph.

Components that differ between any two processes of one job (a function's repr with its
address, such as `fx_kwargs[get_decomp_fn]`) are never named.
"""

from __future__ import annotations

import re
from typing import Any

from ci_fxcache.jobstats.records import graph_of
from ci_fxcache.verify.explain import component_name

NEW_GRAPH, KEY_CHANGED, ENTRY_GONE = "new graph", "key changed", "entry gone"
CAUSES = (NEW_GRAPH, KEY_CHANGED, ENTRY_GONE)
# Measured on torch 2.13: differs between two processes of one job (docs/job-stats.md).
PROCESS_SPECIFIC = frozenset({"fx_kwargs[get_decomp_fn]"})
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
CHANGES_SHOWN = 5
MISSES_SHOWN = 50


def process_specific(name: str, value: Any) -> bool:
    """A component that differs between processes whatever the job does."""
    return name in PROCESS_SPECIFIC or (isinstance(value, str) and bool(_ADDRESS.search(value)))


def differing(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> list[str]:
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


def explain(
    lookups: list[dict[str, Any]], recorded: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One cause per FX graph miss, in the order the job made them."""
    known = dict(recorded)
    out = []
    for lookup in lookups:
        if lookup["cache"] != "fxgraph":
            continue
        comps, key = lookup.get("components") or {}, lookup.get("key")
        graph = graph_of(comps, key)
        if lookup["state"] == "miss":
            out.append(_cause(lookup, graph, comps, known))
        if key and lookup["state"] in ("miss", "hit") and key not in known:
            known[key] = {"graph": graph, "cold_ns": lookup["cold_ns"], "components": comps}
    return out


def _cause(
    lookup: dict[str, Any], graph: str, comps: dict[str, list[Any]], known: dict[str, Any]
) -> dict[str, Any]:
    base = {
        "key": (lookup.get("key") or "")[:16],
        "graph": graph[:40],
        "process": lookup["process"],
    }
    if lookup.get("key") in known:
        return {**base, "cause": ENTRY_GONE, "changed": []}
    same = [e for e in known.values() if e["graph"] == graph and e["components"]]
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
