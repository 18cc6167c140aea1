"""The `identity` request: which recorded reference, if any, a workload still matches.

One request serves one workload on one device, dtype and training mode (a fresh process, like
a phase's, so that what the workload imports shows as in its cold phase); each of its
`variants` is a combination (its dynamic mode and mechanism decide the inputs and the training
loss) with the references recorded for it, newest first. For each it answers the workload's
identity now and the index of the first reference it matches, or why it matches none.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from . import identity, phase


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Answer one `identity` request (never raises: an error is the answer's `error`)."""
    if spec.get("deterministic"):
        phase.deterministic_algorithms()
    modules = identity.Modules()
    answers: dict[str, Any] = {}
    for variant in spec["variants"]:
        combo = {k: spec[k] for k in ("workload", "device", "dtype", "training")}
        combo.update(dynamic=variant["dynamic"], mechanism=variant["mechanism"])
        try:
            answers[variant["key"]] = _match(combo, modules, variant["candidates"])
        except Exception as exc:
            traceback.print_exc()
            answers[variant["key"]] = {"match": None, "why": identity.build_error(exc)}
    return {"status": "ok", "variants": answers}


def _match(
    combo: dict[str, Any], modules: identity.Modules, candidates: list[dict[str, Any]]
) -> dict[str, Any]:
    run, _ = phase.build({"combo": combo, "phase": "identity"}, modules)
    eager = phase.eager_step(run)
    current = phase.workload_identity(run, modules, eager)
    runs = [eager]
    why: str | None = None
    for index, candidate in enumerate(candidates):
        found = identity.exact_change(candidate.get("identity"), current)
        if found is None and candidate["identity"].get("eager") != current["eager"]:
            if len(runs) == 1:
                runs.append(phase.eager_step(run))  # a first call can be off (identity.py)
            recorded = _recorded_eager(Path(candidate["dir"]))
            found = identity.eager_change(recorded, runs, run.tol)
        if found is None:
            return {"match": index, "identity": current}
        why = why or found  # the newest reference's difference is the one to tell
    return {"match": None, "why": why, "identity": current}


def _recorded_eager(directory: Path) -> Any:
    try:
        return phase.load_reference(directory / "reference.pt").get("identity_eager")
    except RuntimeError:
        return None
