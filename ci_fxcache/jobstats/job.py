"""One job's figures: observed from its trace at any time (`fxcache stats`), finished by the
save (figures kept beside the state file, this job's entries recorded in the scope, the
job-private trace removed). JSON first (docs/contracts.md, `fxcache-stats/1`)."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ci_fxcache.jobstats import causes, count, history, records, trace
from ci_fxcache.store.state_file import RestoreState

SCHEMA = "fxcache-stats/1"
STATS_SUFFIX = ".job-stats.json"


def stats_file(state_file: Path) -> Path:
    """Where the save keeps the job's figures, beside the restore's state file."""
    return state_file.with_name(state_file.name + STATS_SUFFIX)


def trace_dirs(state_file: Path) -> list[tuple[Path, bool]]:
    """(directory, ours) to read: the job-private one restore set up, and the job's own
    TORCH_TRACE when it set one (read, never removed)."""
    ours = trace.job_trace_dir(state_file)
    out = [(ours, True)]
    named = os.environ.get(trace.TRACE_ENV)
    if named and Path(named).absolute() != ours.absolute():
        out.append((Path(named), False))
    return out


def recorded_entries(inductor_dir: Path) -> dict[str, dict[str, Any]]:
    """Every entry the scope's record files describe (a newer file wins)."""
    out: dict[str, dict[str, Any]] = {}
    for path in records.files(inductor_dir):
        out.update(records.decode(records.load(path)))
    return out


def saved_by_process(
    spent: dict[tuple[str, str], float], found: list[dict[str, Any]], recorded: dict[str, Any]
) -> dict[str, float]:
    """Compile time the cache saved each process: per FX graph hit, the cold compile time
    recorded with its entry (torch's `time_saved_ns`, else the scope's record) minus this load's
    time (the time torch spent on the hit's frame that its misses did not take, shared by its
    hits); `spent`: count.Tally.frame_seconds."""
    frames: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for lookup in found:
        if lookup["cache"] == "fxgraph":
            frames[(lookup["process"], str(lookup["compile_id"]))].append(lookup)
    out: dict[str, float] = {}
    for frame, lookups in frames.items():
        hits = [x for x in lookups if x["state"] == "hit"]
        if not hits:
            continue
        missed = sum(x["cold_ns"] for x in lookups if x["state"] == "miss") / 1e9
        load_each = max(0.0, spent.get(frame, 0.0) - missed) / len(hits)
        for hit in hits:
            cold = hit["cold_ns"] or (recorded.get(hit["key"]) or {}).get("cold_ns", 0)
            out[frame[0]] = out.get(frame[0], 0.0) + max(0.0, cold / 1e9 - load_each)
    return out


def job_saving(saved: dict[str, float], processes: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's saving: the ranks of one job run side by side, so the step waits for its
    slowest rank (the one that spent the most compile time) and gains that rank's saving, not
    the sum; processes without a rank (steps one after another) add theirs. The sum over all
    processes is kept, named as such."""
    rank_of = {p["process"]: p["rank"] for p in processes}
    spent: dict[int, float] = defaultdict(float)
    by_rank: dict[int, float] = defaultdict(float)
    alone = 0.0
    for p in processes:
        if p["rank"] is not None:
            spent[p["rank"]] += p["compile_s"]
    for process, seconds in saved.items():
        rank = rank_of.get(process)
        if rank is None:
            alone += seconds
        else:
            by_rank[rank] += seconds
    slowest = max(spent, key=lambda r: (spent[r], -r)) if spent else None
    return {
        "saved_s": round(alone + (by_rank.get(slowest, 0.0) if slowest is not None else 0.0), 3),
        "saved_sum_s": round(sum(saved.values()), 3),
        "slowest_rank": slowest,
    }


FXGRAPH_DIR = "fxgraph"  # torch's FX graph entries: <inductor>/fxgraph/<2 chars>/<key>/
ENTRIES_SCANNED = 100_000


def untraced_entries(inductor_dir: Path, since: float, traced: set[str]) -> int:
    """FX graph entries written into the scope after `since` (the restore) that no lookup of
    the trace names: compiles of processes that wrote their trace elsewhere (a TORCH_TRACE set
    for one step) or none. The first ENTRIES_SCANNED entries are looked at."""
    seen = found = 0
    try:
        shards = [
            e for e in os.scandir(inductor_dir / FXGRAPH_DIR) if e.is_dir(follow_symlinks=False)
        ]
        for shard in shards:
            for entry in os.scandir(shard.path):
                seen += 1
                if seen > ENTRIES_SCANNED:
                    return found
                if entry.name in traced or not entry.is_dir(follow_symlinks=False):
                    continue
                found += entry.stat(follow_symlinks=False).st_mtime > since
    except OSError:
        pass
    return found


def _restored_at(state_file: Path) -> float:
    try:
        return state_file.stat().st_mtime
    except OSError:
        return time.time()


def observe(
    state: RestoreState,
    state_file: Path,
    limits: trace.Limits | None = None,
    job_id: str = "current",
) -> dict[str, Any]:
    """The job's figures from its trace so far, each miss explained against the scope."""
    tally = count.Tally()
    read: list[dict[str, Any]] = []
    for directory, ours in trace_dirs(state_file):
        notes = trace.ReadNotes()
        for record in trace.stream(directory, limits or trace.Limits(), notes):
            tally.add(record)
        read.append({"dir": str(directory), "job_private": ours, **notes.to_dict()})
    found = tally.lookups()
    inductor = state.inductor_dir
    recorded = recorded_entries(inductor)
    misses = causes.explain(found, recorded)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "scope_key": state.scope_key,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trace": read,
        **tally.figures(found),
        "miss_causes": causes.by_cause(misses),
        "misses": misses[: causes.MISSES_SHOWN],
    }
    doc.update(
        job_saving(saved_by_process(tally.frame_seconds, found, recorded), doc["by_process"])
    )
    traced = {x["key"] for x in found if x["cache"] == "fxgraph" and x["key"]}
    doc["untraced_entries"] = untraced_entries(inductor, _restored_at(state_file), traced)
    doc["job_id"] = job_id
    doc["run"] = run_number()
    # A job that compiled nothing (a verify-only job) adds no row: "0 % of 0 graphs" is noise.
    current = history.row(doc) if doc.get("graphs") else None
    doc["history"] = history.rows(state.root, state.scope_key, inductor, current)
    doc["_entries"] = _new_entries(found)
    return doc


def run_number() -> str | None:
    """The workflow run's number and attempt (`57.2`), which tells runs of one minute apart in
    the history; None outside Actions."""
    number = os.environ.get("GITHUB_RUN_NUMBER", "")
    attempt = os.environ.get("GITHUB_RUN_ATTEMPT", "")
    if not number.isdigit():
        return None
    return f"{number}.{attempt}" if attempt.isdigit() and attempt != "1" else number


def _new_entries(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The FX graph entries this job's misses made (torch saves one per miss)."""
    return {
        x["key"]: {
            "graph": records.graph_of(x["components"], x["key"]),
            "cold_ns": x["cold_ns"],
            "components": x["components"],
        }
        for x in found
        if x["cache"] == "fxgraph" and x["state"] == "miss" and x["key"]
    }


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without what only the record file needs."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def finish(
    state: RestoreState, state_file: Path, *, may_record: bool, signing_key: str | None = None
) -> dict[str, Any]:
    """At the save: the figures kept beside the state file, this job's entries and figures
    recorded in the scope when it may write it, the job-private trace removed. Once per job: a
    second call returns what the first kept. `signing_key`: the save's (history.py: the
    history it records comes only from what was signed with it)."""
    kept = load(state_file)
    ours = trace.job_trace_dir(state_file)
    if kept is not None and not ours.exists():
        return kept
    job_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{secrets.token_hex(4)}"
    doc = observe(state, state_file, job_id=job_id)
    doc["recorded"] = may_record and not state.read_only
    if doc["recorded"] and doc.get("graphs"):
        doc["history"] = _append_local(state, doc, signing_key)
        if doc["_entries"]:
            # Only with entries it adds: a job that compiled nothing new adds no file to the
            # scope (no new GitHub cache entry, no publish, for a history row).
            body = {"history": doc["history"], **records.encode(doc["_entries"])}
            records.write(state.inductor_dir, f"{job_id}.json", body)
    doc = public(doc)
    stats_file(state_file).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    trace.remove(ours)
    return doc


def _append_local(
    state: RestoreState, doc: dict[str, Any], signing_key: str | None
) -> list[dict[str, Any]]:
    """This job's row added to the local history under the scope's lock (jobs sharing a runner
    save side by side); the rows as written."""
    from ci_fxcache.store import tiered

    root, key = state.root, state.scope_key
    with tiered.scope_lock(root, key):
        rows = history.rows(root, key, state.inductor_dir, history.row(doc), signing_key)
        history.save_local(root, key, rows, signing_key)
    return rows


def load(state_file: Path) -> dict[str, Any] | None:
    """The figures a finished job kept, or None."""
    try:
        doc = json.loads(stats_file(state_file).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None
