"""Restore's state file: where `fxcache restore` writes the scope it handed out, and where
`fxcache save` (and the action's save) reads it back.

The state file lies in a directory the job can write ($RUNNER_TEMP), so it is data, never
instructions: `read_state` takes only a file whose scope key is a valid key of the store
root it names, whose lease and overlay paths lie inside that root, and, when the reader has
the signing key, whose MAC (keyed with it; restore writes it) is right. An action job also
binds it to its own setup (`nonce`, checked by ci_fxcache/action/steps.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.errors import UsageError

STATE_FILE_ENV = "FXCACHE_STATE_FILE"
# The action's restore step sets this to its setup's nonce; restore records it in the state.
NONCE_ENV = "FXCACHE_STATE_NONCE"
_MAC_CONTEXT = b"fxcache-restore-state/1\0"
_STRINGS = ("scope_key", "root", "mode", "scope_dir", "inductor_dir", "triton_dir", "verify_dir")
_OPTIONAL_STRINGS = ("lease", "overlay_dir", "overlay_reason", "read_only_reason", "nonce", "mac")
_COUNTS = ("files", "bytes")


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


def check_target(path: Path) -> None:
    """Restore's --state-file must name a file (new or old), never a directory."""
    if path.is_dir():
        raise UsageError(
            f"--state-file {path} is a directory: name the file restore should write "
            "(or leave --state-file out)"
        )


def _mac(state: dict[str, Any], key: str) -> str:
    body = {k: v for k, v in state.items() if k != "mac"}
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key.encode(), _MAC_CONTEXT + payload, hashlib.sha256).hexdigest()


def write_state(path: Path, state: dict[str, Any], signing_key: str | None) -> None:
    """Write restore's state: with this job's nonce (when the action set one) and, with a
    signing key, a MAC over everything, so that a save holding the key takes only what a
    restore holding it wrote."""
    check_target(path)
    state = dict(state)
    state.pop("mac", None)
    state["nonce"] = os.environ.get(NONCE_ENV) or None
    if signing_key:
        state["mac"] = _mac(state, signing_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")


def _inside(path: str, parent: Path) -> bool:
    """`path` names an entry directly inside `parent` (no `..`, no other directory)."""
    candidate = Path(os.path.normpath(path))
    return candidate.is_absolute() and candidate.parent == parent


def _problem(data: Any, root: Path | None, signing_key: str | None) -> str | None:
    """Why `data` is not a restore state this reader may act on, or None."""
    from ci_fxcache.env import scopekey
    from ci_fxcache.store.layout import Layout
    from ci_fxcache.store.restore import STATE_SCHEMA

    if not isinstance(data, dict):
        return "it is not a JSON object"
    if data.get("schema") != STATE_SCHEMA:
        return f"its schema is {data.get('schema')!r}, not {STATE_SCHEMA}"
    for name in _STRINGS:
        if not isinstance(data.get(name), str):
            return f"{name} is not a string"
    for name in _OPTIONAL_STRINGS:
        if data.get(name) is not None and not isinstance(data[name], str):
            return f"{name} is neither a string nor null"
    for name in _COUNTS:
        value = data.get(name)
        if type(value) is not int or not 0 <= value < 2**63:
            return f"{name} is not a count"
    for name in ("read_only", "hit"):
        if not isinstance(data.get(name), bool):
            return f"{name} is not true or false"
    if not isinstance(data.get("fingerprint"), dict | None):
        return "fingerprint is not an object"
    key = data["scope_key"]
    if not scopekey.KEY_RE.fullmatch(key) or len(key) > scopekey.MAX_KEY_LENGTH:
        return f"scope_key {key[:80]!r} is not a scope key"
    layout = Layout(Path(data["root"]))
    if root is not None and Layout(root).root != layout.root:
        return f"it was written for the store root {data['root']}, not {root}"
    if data.get("lease") is not None and not _inside(data["lease"], layout.leases(key)):
        return f"its lease {data['lease']!r} is not a lease of scope {key} in {layout.root}"
    overlay = data.get("overlay_dir")
    if not data["read_only"] and overlay is not None:
        name = Path(os.path.normpath(overlay)).name
        if not _inside(overlay, layout.overlays) or not name.startswith(f"{key}."):
            return f"its overlay {overlay!r} is not an overlay of scope {key} in {layout.root}"
    if signing_key:
        mac = data.get("mac")
        if not mac:
            return "it carries no MAC, but this save has the signing key (give restore the key)"
        if not hmac.compare_digest(str(mac), _mac(data, signing_key)):
            return "its MAC does not match the signing key (altered, or another key's restore)"
    return None


def read_state(
    path: Path, root: Path | None = None, signing_key: str | None = None
) -> dict[str, Any]:
    """Load restore's state file and check it (see the module's docstring); UsageError (one
    line) when it is absent, unreadable, malformed, or not one this reader may act on."""
    if path.is_dir():
        raise UsageError(
            f"--state-file {path} is a directory: pass the file 'fxcache restore' wrote"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"no restore state at {path}: run 'fxcache restore' first") from exc
    except RecursionError:
        raise UsageError(f"unreadable restore state {path}: nested too deeply") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable restore state {path}: {exc}") from exc
    problem = _problem(data, root, signing_key)
    if problem is not None:
        raise UsageError(f"{path} is not a restore state this save can use: {problem}")
    return dict(data)
