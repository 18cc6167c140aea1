"""Merging results shards from a fleet into one `fxcache-merged/2` document.

Shards are grouped by environment (the scope key without suffix, i.e. the fingerprint hash):
shards of different environments stay in different groups and are never averaged; shards of
one environment (several identical runners) sit side by side in their group.
"""

from __future__ import annotations

from typing import Any

from ci_fxcache import __version__, gha, timestamps
from ci_fxcache.errors import UsageError
from ci_fxcache.results import reader, writer
from ci_fxcache.verify import causes


def _shard_docs(path: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each shard of the file: (as written, verbatim; as read, upgraded to version 2)."""
    doc = reader.read_json(path)
    loaded = reader.from_document(doc, path)
    raw = [doc] if "groups" not in doc else [s for g in doc["groups"] for s in g["shards"]]
    return list(zip(raw, [s.doc for g in loaded.groups for s in g.shards], strict=True))


def _carried_job_stats(path: str) -> list[dict[str, Any]]:
    """The runners' job figures an already merged input carries (a merge of merges keeps them)."""
    doc = reader.read_json(path)
    if not isinstance(doc, dict) or "groups" not in doc:
        return []
    return [js for g in doc["groups"] for js in (g.get("job_stats") or []) if isinstance(js, dict)]


def _job_stats(paths: list[str]) -> list[dict[str, Any]]:
    """Each runner's own job figures (`fxcache stats --json`, `fxcache-stats/1`), as the fleet
    report's job line needs them (job_line.for_fleet); UsageError for a file that is not one."""
    from ci_fxcache.jobstats.job import SCHEMA
    from ci_fxcache.report import job_line

    out = []
    for path in paths:
        doc = reader.read_json(path)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise UsageError(f"--job-stats {path}: not the job's figures (schema {SCHEMA})")
        out.append(job_line.for_fleet(doc))
    return out


def _attach_job_stats(groups: dict[str, dict[str, Any]], stats: list[dict[str, Any]]) -> None:
    """Each runner's figures to the environment of its scope key (a warning for one that
    matches none)."""
    from ci_fxcache.report import job_line

    for doc in stats:
        key = reader.group_key(doc)
        if key not in groups:
            gha.warn(
                f"job figures of scope {doc.get('scope_key') or '(none)'} match no shard's "
                "environment: left out of the fleet report"
            )
            continue
        groups[key].setdefault("job_stats", []).append(job_line.for_fleet(doc))


def key_diffs(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each runner that missed a combination another runner hit: how the two differ.

    `a` is the runner that hit, `b` the one that missed (scope keys; `runners` names them),
    `combos` the ids concerned. Runners of one scope are compared too: torch keys on facts the
    scope key leaves out (the GPU name), and those show among the reported fields.
    """
    from ci_fxcache.fleet import keydiff
    from ci_fxcache.verify import explain

    shards = [shard for group in groups for shard in group["shards"]]

    def ids(shard: dict[str, Any], test: Any) -> set[str]:
        return {c["id"] for c in shard["combos"] if test(c)}

    def runner(shard: dict[str, Any]) -> str:
        return str((shard.get("runner") or {}).get("name") or "runner")

    out: list[dict[str, Any]] = []
    for hit in shards:
        for miss in shards:
            both = sorted(ids(hit, lambda c: c["verdict"] == "safe") & ids(miss, explain.missed))
            if miss is hit or not both:
                continue
            try:
                a = keydiff.from_document(hit, runner(hit))
                b = keydiff.from_document(miss, runner(miss))
            except UsageError:  # a shard without fingerprint or key: nothing to compare
                continue
            entry = {**keydiff.diff(a, b), "runners": {"a": runner(hit), "b": runner(miss)}}
            out.append({**entry, "combos": both})
    return out


def merge(
    paths: list[str], report_id: str | None = None, job_stats: list[str] | None = None
) -> dict[str, Any]:
    """Read shards (results or already merged documents) and group them by environment, with
    each runner's own job figures (`job_stats` files) under its environment's `job_stats`.

    Shards are carried verbatim (a version-1 shard stays version 1; readers upgrade it)."""
    if not paths:
        raise UsageError("merge needs at least one shard: fxcache merge shard*.json -o all.json")
    from ci_fxcache.report.model import environment_title

    groups: dict[str, dict[str, Any]] = {}
    ids: list[str] = []
    read: list[dict[str, Any]] = []
    for path in paths:
        for doc, upgraded in _shard_docs(path):
            read.append(upgraded)
            ids.append(str(doc.get("report_id") or "fxcache"))
            key = reader.group_key(doc)
            title, arch = environment_title(doc.get("fingerprint") or {})
            group = groups.setdefault(
                key,
                {
                    "key": key,
                    "title": title,
                    "arch": arch,
                    "scope_key": doc.get("scope_key"),
                    "runners": [],
                    "shards": [],
                },
            )
            runner = str((doc.get("runner") or {}).get("name") or "runner")
            group["runners"].append(runner)
            group["shards"].append(doc)
    carried = [js for path in paths for js in _carried_job_stats(path)]
    _attach_job_stats(groups, carried + _job_stats(list(job_stats or [])))
    distinct_ids = sorted(set(ids))
    if report_id is None and len(distinct_ids) > 1:
        gha.warn(
            f"shards carry different report ids ({', '.join(distinct_ids)}); using "
            f"{ids[0]!r} (pass --report-id to choose)"
        )
    summary = causes.summary(c for shard in read for c in shard["combos"])
    ordered = sorted(groups.values(), key=lambda g: (g["arch"], g["title"], g["key"]))
    return {
        "ci": writer.ci_from_env(),  # the merge job's run; each shard keeps its own
        "key_diffs": key_diffs(ordered),
        "schema": reader.MERGED_SCHEMA,
        "fxcache_version": __version__,
        "created_at": timestamps.utc_now(),
        "report_id": report_id or ids[0],
        "groups": ordered,
        "summary": summary,
    }
