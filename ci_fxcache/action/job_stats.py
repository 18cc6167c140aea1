"""What the job's own compiles did to its scope, as `sccache --show-stats` gives a build: the
new FX-graph, AOTAutograd and Triton entries the save committed (the job's misses) and their
bytes, the scope's size, and the restore and save times. JSON first; the job summary and the
step outputs render from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store.tiered import Saved

SCHEMA = "fxcache-job-stats/1"
# Kind of cache entry -> the label the summary prints.
KINDS = {"fxgraph": "FX graph", "aotautograd": "AOTAutograd", "triton": "Triton"}


def sizes(outcome: Saved) -> dict[str, int]:
    """relative path -> size of every file the manifest a save committed lists ({} for none)."""
    files = outcome.committed.manifest.get("files") if outcome.committed is not None else None
    if not isinstance(files, dict):
        return {}
    return {str(rel): int(e.get("size") or 0) for rel, e in files.items() if isinstance(e, dict)}


def entry_of(rel: str) -> tuple[str, str] | None:
    """(kind, entry) of a scope file: one FX graph or AOTAutograd entry per file, one Triton
    kernel per directory under triton/; None for anything else (verify's references)."""
    parts = rel.split("/")
    if len(parts) >= 3 and parts[0] == "inductor" and parts[1] in ("fxgraph", "aotautograd"):
        return parts[1], rel
    if len(parts) >= 3 and parts[0] == "triton":
        return "triton", "/".join(parts[:2])
    return None


def compute(outcome: Saved, timings: dict[str, float]) -> dict[str, Any]:
    """The job's stats from its save: the manifest it committed and the files it added to it
    (the store's own record of the save), never a second parse of `manifest.json`, which a
    key-less writer of the store can swap once the scope's lock is released."""
    after = sizes(outcome)
    saved = outcome.summary
    new: dict[str, dict[str, Any]] = {k: {"entries": set(), "bytes": 0} for k in KINDS}
    for rel in outcome.added_files:
        size = after.get(rel, 0)
        found = entry_of(rel)
        if found is not None:
            new[found[0]]["entries"].add(found[1])
            new[found[0]]["bytes"] += size
    return {
        "schema": SCHEMA,
        "saved": bool(saved.get("saved")),
        "reason": saved.get("reason"),
        "new": {k: {"entries": len(v["entries"]), "bytes": v["bytes"]} for k, v in new.items()},
        "scope_files": len(after),
        "scope_bytes": sum(after.values()),
        "restore_s": timings.get("restore_s"),
        "save_s": timings.get("save_s"),
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def render(stats: dict[str, Any]) -> str:
    """The job summary's markdown."""
    times = f"restore {_seconds(stats['restore_s'])}, save {_seconds(stats['save_s'])}"
    scope = f"scope {_size(stats['scope_bytes'])} in {stats['scope_files']} files"
    if not stats["saved"]:
        return f"**fxcache job cache stats:** nothing saved ({stats['reason']}); {times}\n"
    if not any(v["entries"] for v in stats["new"].values()):
        return f"**fxcache job cache stats:** compiled nothing new; {scope}; {times}\n"
    rows = [
        f"| {label} | {stats['new'][kind]['entries']} | {_size(stats['new'][kind]['bytes'])} |"
        for kind, label in KINDS.items()
    ]
    return "\n".join(
        [
            "**fxcache job cache stats** (what this job's compiles added: its misses)",
            "",
            "| new entries | count | bytes |",
            "|---|--:|--:|",
            *rows,
            "",
            f"{scope}; {times}",
            "",
        ]
    )


def publish(stats: dict[str, Any], path: Path) -> None:
    """Write the JSON, the job summary and the step outputs."""
    path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    gha.append_summary(render(stats))
    print(render(stats), end="")
    gha.set_output("stats-json", str(path))
    gha.set_output("new-entries", str(sum(v["entries"] for v in stats["new"].values())))
    gha.set_output("new-bytes", str(sum(v["bytes"] for v in stats["new"].values())))
    gha.set_output("scope-bytes", str(stats["scope_bytes"]))
