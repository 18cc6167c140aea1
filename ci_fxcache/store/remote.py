"""The remote tier (tier 2) behind the local store: one interface, one restore path and one
save path for every backend (`store: github`, `store: s3`; a third is one more module).

restore: a local scope that is present is used as today (the local restore checks it); else
the backend fetches the scope into a fresh directory of the local root, complete or not at
all, which is then renamed into place and restored as a local scope, so every guarantee of the
local store applies. save: the local commit as today, then the backend publishes what it lacks.
Read-only (untrusted) runs read the remote tier and never write it.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout

# Fetches in progress (fresh directories renamed into a scope when complete) and what
# backends keep about the remote tier on this runner (immutable index objects, bad objects).
REMOTE_DIR = ".remote"


class RemoteUnavailable(Exception):
    """The remote tier cannot be used now (unreachable, credentials, missing bucket,
    throttled): one warning, then local-only operation."""


class RemoteCorrupt(Exception):
    """The remote copy of a scope is broken (an object missing, a hash that does not match,
    an unsigned or wrongly signed manifest under a signing key)."""

    def __init__(self, reason: str, problems: list[str] | None = None) -> None:
        super().__init__(reason)
        self.problems = problems or []


@dataclass(frozen=True)
class Fetched:
    """What a fetch wrote: files, bytes, and transfer counts (requests by kind, bytes in)."""

    files: int
    total_bytes: int
    detail: dict[str, Any]


class RemoteTier(Protocol):
    """A backend of tier 2."""

    name: str

    def describe(self) -> str:
        """Where it is, for messages (never a credential)."""
        ...

    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """Create `target` (which does not exist) holding scope `key`'s files and a local
        manifest; None when the remote has no such scope. Every file written is checked
        against the remote index first."""
        ...

    def publish(self, layout: Layout, key: str, signing_key: str | None) -> dict[str, Any]:
        """Upload what the remote copy of committed local scope `key` lacks."""
        ...

    def touch(self, key: str) -> None:
        """Mark scope `key` as used now, cheaply (invalidation's --max-age)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Transfer counts so far (requests by kind, bytes each way), where the backend has them."""
        ...


def tier_for(store: str, url: str | None) -> RemoteTier | None:
    """The backend that the CLI's `--store` names (None for stores without tier 2)."""
    if store == "s3":
        from ci_fxcache.store import s3_client, s3_tier

        return s3_tier.S3Tier(s3_client.resolve_url(url))
    return None


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


def save_and_publish(path: Path, root: Path | None, signing_key: str | None) -> dict[str, Any]:
    """`save_from_state`, then, for a restore that used a remote tier and may write, the
    publication of what the remote copy lacks (also after a save that added nothing: a save
    killed during its upload is completed by the next one)."""
    from ci_fxcache.store import save as store_save
    from ci_fxcache.store import state_file

    result = store_save.save_from_state(path, root, signing_key)
    state = state_file.read_state(path)
    layout = Layout(root if root is not None else Path(state["root"]))
    return publish_from_state(layout, state, result, signing_key)


def publish_from_state(
    layout: Layout,
    state: dict[str, Any],
    result: dict[str, Any],
    signing_key: str | None,
    store: str | None = None,
) -> dict[str, Any]:
    """After the local save `result` of restore's `state`: publish what the remote tier the
    restore used lacks, when it used one and may write. `store`, when given (the action's
    setup decided it), must be the store the state names; a state that names another is
    not followed."""
    remote = state.get("remote")
    if not isinstance(remote, dict) or state.get("read_only") or not result.get("saved"):
        return result
    if remote.get("read_only"):  # restore --remote-read-only: this run reads the tier only
        return result
    if store is not None and remote.get("store") != store:
        gha.warn(f"the restore state names store {remote.get('store')!r}, setup chose {store!r}")
        return result
    try:
        tier = tier_for(str(remote.get("store")), str(remote.get("url") or "") or None)
    except Exception as exc:  # a state file edited by hand: not a reason to fail the job
        gha.warn(f"remote tier of the restore unusable ({exc}); kept locally")
        return result
    if tier is not None:
        result["remote"] = publish_scope(layout, state["scope_key"], tier, signing_key)
    return result
