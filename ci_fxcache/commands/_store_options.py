"""Options and helpers shared by `restore`, `save` and `invalidate`."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.errors import UsageError
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import default_root


def root_option(parser: argparse.ArgumentParser, default_from_env: bool = True) -> None:
    """`--root DIR` (env FXCACHE_ROOT)."""
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="store root (env FXCACHE_ROOT; default $RUNNER_TOOL_CACHE/fxcache inside Actions, "
        "~/.cache/fxcache elsewhere)",
    )


def resolve_root(value: Path | None) -> Path:
    """The root from --root or the default rules."""
    return value if value is not None else default_root()


STATE_FILE_ENV = "FXCACHE_STATE_FILE"


def new_state_file() -> Path:
    """Where a restore without --state-file writes its state: inside Actions
    `$RUNNER_TEMP/fxcache-restore-state.json` (RUNNER_TEMP belongs to one job), elsewhere a new
    file per restore, so unrelated shells and jobs never share one; restore exports its path
    as FXCACHE_STATE_FILE."""
    runner_temp = os.environ.get("RUNNER_TEMP")
    if runner_temp and gha.in_actions():
        return Path(runner_temp) / "fxcache-restore-state.json"
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
    runner_temp = os.environ.get("RUNNER_TEMP")
    if runner_temp and gha.in_actions():
        return Path(runner_temp) / "fxcache-restore-state.json"
    raise UsageError(
        f"no restore state: pass --state-file, or set {STATE_FILE_ENV} as 'fxcache restore' "
        "exported it (run 'fxcache restore' first)"
    )


def state_file_option(parser: argparse.ArgumentParser) -> None:
    """`--state-file F`: where restore writes its state and save reads it."""
    parser.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="restore's state (JSON); save defaults to $FXCACHE_STATE_FILE, which restore exports",
    )


def signing_key() -> str | None:
    """The HMAC key from FXCACHE_SIGNING_KEY (masked in Actions logs), or None."""
    key = os.environ.get(mf.SIGNING_ENV) or None
    if key:
        gha.mask(key)
    return key


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
