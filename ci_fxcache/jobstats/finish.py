"""The save's side of the job's figures: one call for `fxcache save` and the action's saves.
A trace that cannot be read never fails a save."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.jobstats import job
from ci_fxcache.store.state_file import RestoreState


def at_save(
    state: RestoreState, state_file: Path, *, may_record: bool, signing_key: str | None = None
) -> dict[str, Any] | None:
    """The job's figures of restore's `state` (kept in `state_file`), finished (job.finish,
    with the save's `signing_key`); None, with a warning, when the trace or the store cannot
    be written."""
    try:
        return job.finish(state, state_file, may_record=may_record, signing_key=signing_key)
    except OSError as exc:
        gha.warn(f"fxcache stats: the job's compiles were not counted: {exc}")
        return None
