"""Restore's state file: where `fxcache restore` writes the scope it handed out, and where
`fxcache save` (and the action's save) reads it back."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.errors import UsageError

STATE_FILE_ENV = "FXCACHE_STATE_FILE"


def _job_state_file() -> Path | None:
    """Inside Actions, the job's own state file (RUNNER_TEMP belongs to one job); else None."""
    runner_temp = os.environ.get("RUNNER_TEMP")
    if runner_temp and gha.in_actions():
        return Path(runner_temp) / "fxcache-restore-state.json"
    return None


def new_state_file() -> Path:
    """Where a restore without --state-file writes its state: inside Actions
    `$RUNNER_TEMP/fxcache-restore-state.json` (RUNNER_TEMP belongs to one job), elsewhere a new
    file per restore, so unrelated shells and jobs never share one; restore exports its path
    as FXCACHE_STATE_FILE."""
    job_file = _job_state_file()
    if job_file is not None:
        return job_file
    fd, path = tempfile.mkstemp(prefix="fxcache-restore-state-", suffix=".json")
    os.close(fd)
    return Path(path)


def saved_state_file(value: Path | None) -> Path:
    """The state file `save` reads: --state-file, else FXCACHE_STATE_FILE (exported by restore),
    else the job's default inside Actions; UsageError when none is known."""
    if value is not None:
        return value
    env = os.environ.get(STATE_FILE_ENV)
    if env:
        return Path(env)
    job_file = _job_state_file()
    if job_file is not None:
        return job_file
    raise UsageError(
        f"no restore state: pass --state-file, or set {STATE_FILE_ENV} as 'fxcache restore' "
        "exported it (run 'fxcache restore' first)"
    )


def read_state(path: Path) -> dict[str, Any]:
    """Load restore's state file; UsageError when absent or malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"no restore state at {path}: run 'fxcache restore' first") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable restore state {path}: {exc}") from exc
    if not isinstance(data, dict) or "scope_key" not in data:
        raise UsageError(f"{path} is not a state file written by 'fxcache restore'")
    return data
