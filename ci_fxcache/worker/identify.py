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
    built: dict[tuple[bool, bool], Current] = {}
    answers: dict[str, Any] = {}
    for variant in spec["variants"]:
        combo = {k: spec[k] for k in ("workload", "device", "dtype", "training")}
        combo.update(dynamic=variant["dynamic"], mechanism=variant["mechanism"])
        # What the identity depends on besides the request's workload, device, dtype and
        # training mode: whether the inputs hold a second shape, and the training loss.
        same = (combo["dynamic"] != "false", combo["mechanism"] == "precompile-api")
        try:
            if same not in built:
                built[same] = Current(combo, modules)
            answers[variant["key"]] = built[same].match(variant["candidates"])
        except Exception as exc:
            traceback.print_exc()
            why = identity.build_error(exc)
            answers[variant["key"]] = {"match": None, "why": why, "unchecked": True}
    return {"status": "ok", "variants": answers}


class Current:
    """The workload as it is now, for one kind of combination: built, stepped once eagerly,
    its identity; a second eager step taken only when a comparison needs one."""

    def __init__(self, combo: dict[str, Any], modules: identity.Modules) -> None:
        self.run, _ = phase.build({"combo": combo, "phase": "identity"}, modules)
        eager = phase.eager_step(self.run)
        self.identity = phase.workload_identity(self.run, modules, eager)
        self.eager_runs = [eager]

    def match(self, candidates: list[dict[str, Any]]) -> dict[str, Any]:
        """The index of the first recorded version this workload matches, or why none."""
        why: str | None = None
        for index, candidate in enumerate(candidates):
            recorded: dict[str, Any] = candidate.get("identity") or {}
            found = identity.exact_change(recorded, self.identity)
            if found is None and not identity.deterministic(recorded):
                found = self._eager_on_recorded(Path(candidate["dir"]))
            elif found is None and recorded.get("eager") != self.identity["eager"]:
                if len(self.eager_runs) == 1:  # a first call can be off (identity.py)
                    self.eager_runs.append(phase.eager_step(self.run))
                reference = _recorded(Path(candidate["dir"]))
                found = identity.eager_change(
                    reference.get("identity_eager"), self.eager_runs, self.run.tol
                )
            if found is None:
                return {"match": index, "identity": self.identity}
            why = why or found  # the newest reference's difference is the one to tell
        return {"match": None, "why": why, "identity": self.identity}

    def _eager_on_recorded(self, directory: Path) -> str | None:
        """A factory that is not deterministic: the model rebuilt now, stepped eagerly on the
        recorded weights and inputs (as the hot phase is), against the recorded eager step
        within the dtype's tolerance (twice, as a first call can be off)."""
        reference = _recorded(directory)
        if not reference.get("inputs"):
            return "its eager outputs changed (the reference holds none to compare with)"
        run = self.run
        kept = (run.reference, run.work.inputs)
        run.reference, run.work.inputs = reference, tuple(reference["inputs"])
        try:
            steps = [phase.eager_step(run), phase.eager_step(run)]
        finally:
            run.reference, run.work.inputs = kept
        return identity.eager_change(reference.get("identity_eager"), steps, run.tol)


def _recorded(directory: Path) -> dict[str, Any]:
    """The reference's tensors (`reference.pt`); empty when unreadable."""
    try:
        return phase.load_reference(directory / "reference.pt")
    except RuntimeError:
        return {}
