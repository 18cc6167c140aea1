"""One restore path and one save path for every backend of the remote tier (`store: github`,
`store: s3`; a third is one more module).

restore: a local scope that is present is used as today (the local restore checks it); else
the backend fetches the scope into a fresh directory of the local root, complete or not at
all, which is then renamed into place and restored as a local scope, so every guarantee of the
local store applies. save: the local commit as today (store.tiered composes the two), then the
backend publishes what it lacks. Read-only (untrusted) runs read the remote tier and never
write it.

No network I/O under the scope's lock: the lock is held to decide whether a fetch is needed
and to rename a finished fetch into place, never while the backend talks to the remote, so a
hung or slow remote never stalls another job of the runner that has what it needs. A fetch in
progress holds a lock of its own (`fetch-*.lock`, flocked): a directory whose lock is free is a
killed fetch's, removed by the next restore of any scope.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes, seal
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote.tier import REMOTE_DIR, RemoteCorrupt, RemoteTier, RemoteUnavailable
from ci_fxcache.store.seal import Fresh


def _in_use(layout: Layout, key: str) -> bool:
    """Whether a live job holds scope `key` in place (it writes there now)."""
    return bool(scopes.live_leases(layout, key, "in-place"))


def _present(layout: Layout, key: str, signing_key: str | None) -> bool:
    """Is there a local scope to use as today? Called under the scope's lock. What this job
    could not use is moved out of the way so that the remote copy is fetched instead: an
    empty leftover (a cold job's directories) is removed; files without a manifest (a job
    cancelled before its save) are set aside; with a signing key, a manifest that does not
    verify with it (a key-less read-only job's fetch) is quarantined. Never while a live job
    holds the scope in place."""
    scope = layout.scope(key)
    if scope.is_symlink():
        return True  # the local restore quarantines it
    if layout.manifest(key).exists():
        if not signing_key or _in_use(layout, key):
            return True
        reason = _signature_problem(layout, key, signing_key)
        if reason is None:
            return True
        where = scopes.quarantine(layout, key, f"{reason} (replaced by the remote copy)", [])
        print(f"fxcache: local copy of {key} moved to {where} ({reason}); fetching the "
              "remote copy", file=sys.stderr)  # fmt: skip
        return False
    if not scope.is_dir():
        return False
    if _in_use(layout, key):
        return True
    try:
        files, problems = mf.scan(scope)
    except OSError:
        return True
    if problems:
        return True  # the local restore quarantines what it cannot read
    if files:
        where = scopes.set_aside(layout, key, sorted(files), "unsaved files of a cancelled job")
        print(f"fxcache: {len(files)} unsaved file(s) of a job that ended without saving "
              f"moved to {where}; fetching the remote copy", file=sys.stderr)  # fmt: skip
    scopes.remove_tree(scope)
    return False


def _signature_problem(layout: Layout, key: str, signing_key: str) -> str | None:
    try:
        manifest = mf.load(layout.manifest(key))
    except mf.ManifestError as exc:
        return str(exc)
    return mf.signature_problem(manifest, signing_key)


def _clear_killed_fetches(layout: Layout) -> None:
    """Remove what killed fetches (of any scope) left in `.remote/`: a fetch directory whose
    lock nobody holds, or that has no lock at all."""
    remote = layout.root / REMOTE_DIR
    if not remote.is_dir():
        return
    for lock in remote.glob("fetch-*.lock"):
        held = _try_lock(lock)
        if held is None:
            continue  # a live fetch
        try:
            scopes.remove_tree(lock.with_suffix(""))
            lock.unlink(missing_ok=True)
        finally:
            os.close(held)
    for left in remote.glob("fetch-*"):
        if left.is_dir() and not left.with_name(left.name + ".lock").exists():
            scopes.remove_tree(left)
    for early in remote.glob(".tmp-fetch-*.lock"):  # a fetch killed before it began
        held = _try_lock(early)
        if held is not None:
            early.unlink(missing_ok=True)
            os.close(held)


def _try_lock(path: Path) -> int | None:
    """An fd holding `path`'s flock, or None when another process holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def _fetch_dir(layout: Layout, key: str) -> Iterator[Path]:
    """A fresh path `.remote/fetch-KEY.ID` (not created) whose lock this process holds; both
    removed afterwards. The lock exists before the directory does."""
    target = layout.root / REMOTE_DIR / f"fetch-{key}.{uuid.uuid4().hex[:12]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(target.name + ".lock")
    # Locked under another name, then renamed: a lock file visible as `fetch-*.lock` is
    # always held by a live fetch (or free because its fetch died).
    early = target.with_name(f".tmp-{lock.name}")
    fd = os.open(early, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(early, lock)
        yield target
    finally:
        try:
            scopes.remove_tree(target)
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)


def fetch_scope(
    layout: Layout, key: str, tier: RemoteTier, *, signing_key: str | None
) -> tuple[dict[str, Any], Fresh | None]:
    """Bring scope `key` from the remote tier into the local root unless it is present; the
    state's `remote` object, and what the fetch vouches for when it put the scope in place
    (store.seal.Fresh: for the local restore that follows at once). Never raises for the
    remote's sake: an unusable remote is one warning, a broken remote copy is quarantined
    locally (the job continues cold). A tier this run may not write (ReadOnly) gets no
    last-used marker."""
    info: dict[str, Any] = {"store": tier.name, "url": tier.describe(), "fetched": False}
    written = None
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        _clear_killed_fetches(layout)
        with scopes.lock(layout, key):
            info["local"] = _present(layout, key, signing_key)
        if not info["local"]:
            written = _fetch(layout, key, tier, signing_key, info)
    except (RemoteUnavailable, OSError) as exc:  # OSError: the local root (a full disk)
        info["error"] = str(exc)
        gha.warn(
            f"restoring from {tier.describe()} failed ({exc}); continuing with the local store only"
        )
    except RemoteCorrupt as exc:
        info["error"] = str(exc)
        _refused(tier, key, exc, info.setdefault("quarantined", None))
    if not tier.read_only and "error" not in info and info.get("found", True):
        _touch(tier, key, info)
    info.update(tier.stats())
    return info, written if "error" not in info else None


def _fetch(
    layout: Layout, key: str, tier: RemoteTier, signing_key: str | None, info: dict[str, Any]
) -> Fresh | None:
    """The fetch, with no lock but its own; then, under the scope's lock, the rename into
    place (unless another job put a scope there meanwhile: then ours is discarded); what the
    fetch vouches for once in place."""
    with _fetch_dir(layout, key) as target:
        try:
            got = tier.fetch(layout, key, target, signing_key)
        except RemoteCorrupt as exc:
            info["quarantined"] = _keep_broken(layout, key, target, exc)
            raise
        if got is None:
            info["found"] = False
            return None
        info.update(found=True, files=got.files, bytes=got.total_bytes)
        info.update(got.detail)
        with scopes.lock(layout, key):
            if os.path.lexists(layout.scope(key)):
                info["discarded"] = "another job put the scope in place meanwhile"
                return None
            os.rename(target, layout.scope(key))
            if got.written is not None:
                seal.write(layout, key, got.written.manifest_sha256, got.written.sealed)
            info["fetched"] = True
            return got.written


def _keep_broken(layout: Layout, key: str, target: Path, exc: RemoteCorrupt) -> str | None:
    """Move what a broken fetch wrote into `.quarantine/` with a note (when it wrote anything
    and the scope's place is free); where it went."""
    if not target.exists():
        return None
    with scopes.lock(layout, key):
        if os.path.lexists(layout.scope(key)):
            return None
        os.rename(target, layout.scope(key))
        return str(scopes.quarantine(layout, key, f"remote copy broken: {exc}", exc.problems))


def _refused(tier: RemoteTier, key: str, exc: RemoteCorrupt, where: str | None) -> None:
    """Say once that the remote copy is refused (and where the broken fetch went)."""
    first = f"; first: {exc.problems[0]}" if exc.problems else ""
    moved = f"; moved to {where}" if where else ""
    gha.warn(
        f"restoring from {tier.describe()} failed: its copy of cache scope {key} is refused "
        f"({exc}{first}){moved}; continuing cold"
    )


def _touch(tier: RemoteTier, key: str, info: dict[str, Any]) -> None:
    """The last-used marker: best-effort and bounded by the backend, no lock held."""
    try:
        tier.touch(key)
        info["touched"] = True
    except RemoteUnavailable as exc:
        info["touched"] = False
        gha.warn(f"could not mark {key} as used in {tier.describe()} ({exc}); restore continues")


def publish_scope(
    layout: Layout,
    key: str,
    tier: RemoteTier,
    committed: mf.Committed,
    signing_key: str | None,
) -> dict[str, Any]:
    """Publish the files of scope `key` that `committed` (its save's manifest) lists; the save
    result's `remote` object (one warning when the remote is unusable, never an exception for
    its sake)."""
    info: dict[str, Any] = {"store": tier.name, "url": tier.describe()}
    try:
        done = tier.publish(layout, key, committed, signing_key)
    except (RemoteUnavailable, RemoteCorrupt) as exc:
        info.update(published=False, error=str(exc))
        gha.warn(f"publishing {key} to {tier.describe()} failed ({exc}); kept locally")
        return info
    if done.replaced:
        gha.warn(
            f"the copy of {key} in {tier.describe()} was not one this job can extend "
            f"({done.replaced}): replaced by this job's own files"
        )
    return {**info, **done.to_dict()}
