"""One restore path and one save path for every backend of the remote tier (`store: github`,
`store: s3`; a third is one more module).

restore: a local scope that is present is used as today (the local restore checks it); else
the backend fetches the scope into a fresh directory of the local root, complete or not at
all, which is then renamed into place and restored as a local scope, so every guarantee of the
local store applies. save: the local commit as today (store.tiered composes the two), then the
backend publishes what it lacks. Read-only (untrusted) runs read the remote tier and never
write it.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote.tier import REMOTE_DIR, RemoteCorrupt, RemoteTier, RemoteUnavailable


def _present(layout: Layout, key: str) -> bool:
    """Is there a local scope to use as today? An empty leftover (a cold job's directories,
    no manifest, no files) is removed and counts as absent."""
    scope = layout.scope(key)
    if scope.is_symlink() or layout.manifest(key).exists():
        return True
    if not scope.is_dir():
        return False
    try:
        files, problems = mf.scan(scope)
    except OSError:
        return True
    if files or problems:
        return True  # unsaved files of a job: the local restore decides about them
    scopes.remove_tree(scope)
    return False


def fetch_scope(
    layout: Layout, key: str, tier: RemoteTier, *, read_only: bool, signing_key: str | None
) -> dict[str, Any]:
    """Bring scope `key` from the remote tier into the local root unless it is present; the
    state's `remote` object. Never raises for the remote's sake: an unusable remote is one
    warning, a broken remote copy is quarantined locally (the job continues cold)."""
    info: dict[str, Any] = {"store": tier.name, "url": tier.describe(), "fetched": False}
    target = layout.root / REMOTE_DIR / f"fetch-{key}.{uuid.uuid4().hex[:12]}"
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        with scopes.lock(layout, key):
            for left in (layout.root / REMOTE_DIR).glob(f"fetch-{key}.*"):
                scopes.remove_tree(left)  # a fetch of this scope killed half-way (we hold its lock)
            if _present(layout, key):
                info["local"] = True
            else:
                info["local"] = False
                target.parent.mkdir(parents=True, exist_ok=True)
                got = tier.fetch(layout, key, target, signing_key)
                if got is None:
                    info["found"] = False
                else:
                    os.rename(target, layout.scope(key))
                    info.update(fetched=True, found=True, files=got.files, bytes=got.total_bytes)
                    info.update(got.detail)
            if not read_only and info.get("found", True):
                tier.touch(key)
            info.update(tier.stats())
    except (RemoteUnavailable, OSError) as exc:  # OSError: the local root (a full disk)
        info["error"] = str(exc)
        gha.warn(
            f"restoring from {tier.describe()} failed ({exc}); continuing with the local store only"
        )
    except RemoteCorrupt as exc:
        info["error"] = str(exc)
        info["quarantined"] = _quarantine(layout, key, tier, target, exc)
    finally:
        if target.exists():
            scopes.remove_tree(target)
    return info


def _quarantine(
    layout: Layout, key: str, tier: RemoteTier, target: Path, exc: RemoteCorrupt
) -> str | None:
    """Keep what a broken fetch wrote in `.quarantine/` with a note; say so once."""
    where: Path | None = None
    if target.exists() and not os.path.lexists(layout.scope(key)):
        os.rename(target, layout.scope(key))
        where = scopes.quarantine(layout, key, f"remote copy broken: {exc}", exc.problems)
    first = f"; first: {exc.problems[0]}" if exc.problems else ""
    moved = f"; moved to {where}" if where else ""
    gha.warn(
        f"restoring from {tier.describe()} failed: its copy of cache scope {key} is refused "
        f"({exc}{first}){moved}; continuing cold"
    )
    return str(where) if where else None


def publish_scope(
    layout: Layout, key: str, tier: RemoteTier, signing_key: str | None
) -> dict[str, Any]:
    """Publish committed scope `key`; the save result's `remote` object (one warning when the
    remote is unusable, never an exception for its sake)."""
    info: dict[str, Any] = {"store": tier.name, "url": tier.describe()}
    try:
        info.update(tier.publish(layout, key, signing_key))
    except (RemoteUnavailable, RemoteCorrupt) as exc:
        info.update(published=False, error=str(exc))
        gha.warn(f"publishing {key} to {tier.describe()} failed ({exc}); kept locally")
    return info
