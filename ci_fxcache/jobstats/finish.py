"""The save's side of the job's figures: one call for `fxcache save` and the action's saves.
A trace that cannot be read never fails a save."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.errors import UsageError
from ci_fxcache.jobstats import job


def at_save(
    state_file: Path, root: Path | None, signing_key: str | None, *, may_record: bool
) -> dict[str, Any] | None:
    """The job's figures, finished (job.finish); None when the restore state is not one the
    save can use (the save says why, once), or, with a warning, when the trace or the store
    cannot be written."""
    from ci_fxcache.store import state_file as states

    try:
        state = states.read_state(state_file, root, signing_key)
    except UsageError:
        return None
    try:
        return job.finish(state, state_file, may_record=may_record)
    except OSError as exc:
        gha.warn(f"fxcache stats: the job's compiles were not counted: {exc}")
        return None
