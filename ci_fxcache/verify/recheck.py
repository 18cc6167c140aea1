"""What a hot-only run re-checks, and the verdicts it carries from the run that built the cache.

A run that compiled cold records each combination's verdict beside its reference
(`verdict.json`). A later hot-only run on that cache re-checks every combination except a
`no-gain` one whose hot phase would read exactly what the recorded hot phase read, for the same
workload (the runner only gets here for a version of the combination whose workload identity
matches: verify/versions.py), judged by the same rules in the same environment; that one is
carried with a `carried` note that says when it was judged. docs/verify.md says why.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ci_fxcache import __version__, mechanisms, timestamps
from ci_fxcache.verify import causes, verdict_kinds

VERDICT_FILE = "verdict.json"
CARRIED_VERDICTS = verdict_kinds.carried()
# The settings a verdict depends on (besides the evidence): a change re-checks.
JUDGING_SETTINGS = ("min_speedup", "compare")
# Notes about the run that judged, not about the combination: never carried.
RUN_NOTES = ("carried", "workload-changed")


def context(scope_key: str | None) -> dict[str, Any]:
    """What else a carried verdict depends on: the scope it was judged in (torch, CUDA,
    Triton, Python, the GPU architectures, the key's salt) and the fxcache that judged it (a
    newer one may judge, or build the workloads, differently)."""
    return {"scope_key": scope_key, "fxcache": __version__}


def record(
    combo_dir: Path,
    judged: dict[str, Any],
    settings: dict[str, Any],
    torch_version: str,
    judged_in: dict[str, Any],
) -> None:
    """Record the verdict of a run that compiled `combo_dir`'s cache cold (`judged_in`:
    `context`)."""
    (combo_dir / VERDICT_FILE).write_text(
        json.dumps(
            {
                "judged_at": timestamps.utc_now(),
                "run_id": os.environ.get("GITHUB_RUN_ID"),
                "torch_version": torch_version,
                "settings": {k: settings[k] for k in JUDGING_SETTINGS},
                "context": judged_in,
                "inputs": inputs_digest(combo_dir),
                "judged": judged,
            },
            indent=1,
        )
    )


def carried(
    combo_dir: Path,
    mechanism: str,
    settings: dict[str, Any],
    torch_version: str,
    judged_in: dict[str, Any],
) -> dict[str, Any] | None:
    """The recorded judgement to carry into this hot-only run, with its `carried` note; None
    when the combination must be re-checked (anything unreadable or unexpected included, and
    a verdict recorded in another `context` or by an fxcache that recorded none)."""
    # Carried where the hot phase starts from an empty directory and the artifact file(s) the
    # cold phase wrote: every hot-only run feeds it the same bytes (the record's `carried`).
    # A hot phase that reads the cold directory in place, or a shared Redis, changes between jobs.
    record = mechanisms.find(mechanism)
    if record is None or not record.carried:
        return None
    try:
        recorded = json.loads((combo_dir / VERDICT_FILE).read_text())
        judged = dict(recorded["judged"])
        same = (
            recorded["torch_version"] == torch_version
            and all(recorded["settings"][k] == settings[k] for k in JUDGING_SETTINGS)
            and recorded.get("context") == judged_in
            and recorded["inputs"] == inputs_digest(combo_dir)
        )
        judged_at, run_id = str(recorded["judged_at"]), recorded.get("run_id")
        if judged.get("verdict") not in CARRIED_VERDICTS or not same:
            return None
        notes = [n for n in judged.get("notes") or [] if n.get("kind") not in RUN_NOTES]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    source = f"run {run_id} at {judged_at}" if run_id else judged_at
    text = (
        f"not re-checked this run: {judged['verdict']} as judged when the cache was built "
        f"({source}); re-checked when the cache is rebuilt, the workload or the environment "
        "changes, or with --recheck-all"
    )
    extra: dict[str, Any] = {"judged_at": judged_at, "run_id": run_id}
    age = timestamps.age_s(judged_at)
    if age is not None:
        extra["age_s"] = round(age)
    judged["notes"] = [*notes, causes.note("carried", text, **extra)]
    return judged


def inputs_digest(combo_dir: Path) -> str:
    """sha256 over the files the hot phase of a carried mechanism reads: every file directly in
    the combination's directory (the artifact file(s), `reference.pt`, `reference.json`) but
    `verdict.json`. A changed byte there (an artifact replaced by hand, outside the store's
    checks) re-checks the combination instead of carrying its verdict."""
    digest = hashlib.sha256()
    for path in sorted(combo_dir.iterdir()):
        if path.is_file() and path.name != VERDICT_FILE:
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()
