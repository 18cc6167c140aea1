"""Save: commit the scope a trusted in-place restore handed out, under the per-scope lock."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import LOCKS, Layout

# Fault injection for the reliability tests, never set in production: `pause:SECONDS` (so a
# test can kill -9 the save between the temporary manifest and the rename) or `enospc`.
FAULT_ENV = "FXCACHE_TEST_FAULT"


def _verification(scope: Path) -> list[str]:
    """Combination ids with a recorded verification reference under `verify/`."""
    verify = scope / "verify"
    if not verify.is_dir():
        return []
    return sorted(p.parent.name for p in verify.glob("*/reference.json"))


def build_manifest(
    scope: Path, key: str, state: dict[str, Any], previous: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, os.stat_result]]:
    """The new manifest of `scope`: every file hashed, symlinks and strays left out."""
    files, problems = mf.scan(scope)
    for problem in problems:
        if problem.kind == "symlink" and "/" in problem.path:
            gha.warn(f"save: removed symlink {problem.path} from scope {key} (never cached)")
            (scope / problem.path).unlink(missing_ok=True)
    entries = mf.file_entries(scope, files)
    now = scopes.utc_now()
    return {
        "schema": mf.SCHEMA,
        "scope_key": key,
        "fingerprint": state.get("fingerprint"),
        "created_at": (previous or {}).get("created_at") or now,
        "updated_at": now,
        "last_used_at": now,
        "verification": {"references": _verification(scope)},
        "files": entries,
        "total_bytes": sum(e["size"] for e in entries.values()),
    }, files


def save(layout: Layout, state: dict[str, Any], signing_key: str | None) -> dict[str, Any]:
    """Write the manifest atomically; return a summary. OSError propagates to the caller."""
    key = state["scope_key"]
    scope = layout.scope(key)
    with scopes.lock(layout, key):
        lease = Path(state["lease"]) if state.get("lease") else None
        if not scope.is_dir():
            if lease:
                lease.unlink(missing_ok=True)
            return {"saved": False, "reason": f"scope {key} no longer exists (quarantined?)"}
        previous = None
        with contextlib.suppress(mf.ManifestError):
            previous = mf.load(layout.manifest(key))
        manifest, files = build_manifest(scope, key, state, previous)
        if signing_key:
            mf.sign(manifest, signing_key)
        mf.make_read_only(scope, files)
        _write(layout, key, manifest)
        if lease:
            lease.unlink(missing_ok=True)
        scopes.touch_last_used(layout, key)
    added = len(manifest["files"].keys() - (previous or {}).get("files", {}).keys())
    return {
        "saved": True,
        "scope_key": key,
        "files": len(manifest["files"]),
        "added": added,
        "bytes": manifest["total_bytes"],
        "signed": bool(signing_key),
    }


def _fault_hook() -> Callable[[], None] | None:
    """Test-only fault injection between the temporary manifest and the rename."""
    fault = os.environ.get(FAULT_ENV, "")
    if fault.startswith("pause:"):
        seconds = float(fault.split(":", 1)[1])

        def pause() -> None:
            print("fxcache: test fault: temporary manifest written, pausing", flush=True)
            time.sleep(seconds)

        return pause
    if fault == "enospc":

        def enospc() -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return enospc
    return None


def _write(layout: Layout, key: str, manifest: dict[str, Any]) -> None:
    mf.write_atomic(layout.manifest(key), manifest, layout.root / LOCKS, _fault_hook())
