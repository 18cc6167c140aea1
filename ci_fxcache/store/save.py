"""Save: add a trusted job's new files to its scope's manifest, under the per-scope lock.

Committed files are immutable: they are checked, never re-hashed into the manifest or re-signed.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ci_fxcache import gha, names
from ci_fxcache.store import in_place, modes, references, scopes, seal, spare, stat_batch
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import LOCKS, Layout
from ci_fxcache.store.state_file import RestoreState

# Fault injection for the reliability tests, never set in production: `pause:SECONDS` (so a
# test can kill -9 the save between the temporary manifest and the rename) or `enospc`.
FAULT_ENV = names.TEST_FAULT_ENV


def _verification(scope: Path) -> list[str]:
    """Combination ids with a recorded verification reference under `verify/`."""
    verify = scope / "verify"
    if not verify.is_dir():
        return []
    return sorted(p.parent.name for p in verify.glob("*/reference.json"))


class Refused(Exception):
    """The scope's committed state cannot be extended (it was quarantined); why."""


def _inspect(
    scope: Path, key: str, listed: dict[str, Any], sealed: stat_batch.Dirs
) -> mf.Inspection:
    """The scope checked against the committed entries `listed`; symlinks a job left in the
    cache dirs are removed first (never cached), then the scope is checked again."""
    found = mf.inspect(scope, {"files": listed}, False, sealed)
    strays = [
        p.path
        for p in found.problems
        if p.kind == "symlink" and "/" in p.path and p.path not in listed
    ]
    for rel in strays:
        gha.warn(f"save: removed symlink {rel} from scope {key} (never cached)")
        (scope / rel).unlink(missing_ok=True)
    return mf.inspect(scope, {"files": listed}, False, sealed) if strays else found


class Outcome(NamedTuple):
    """A save's summary (JSON), and the manifest it checked, signed and wrote under the scope's
    lock (None when it wrote none): what a publish sends, never a re-read of the disk; and the
    files this save added to it (the job's new entries)."""

    summary: dict[str, Any]
    committed: mf.Committed | None
    added: tuple[str, ...] = ()


class _Committed(NamedTuple):
    manifest: dict[str, Any] | None
    inspection: mf.Inspection


def _committed(layout: Layout, key: str, signing_key: str | None) -> _Committed:
    """The scope's current manifest, checked: committed files unchanged (size, mtime, and the
    sha256 of any file whose mtime moved), signature valid. Refused (after quarantining the
    scope) when not: a changed committed file is never re-recorded or re-signed."""
    scope = layout.scope(key)
    previous: dict[str, Any] | None = None
    sealed = seal.NONE
    reason: str | None = None
    lines: list[str] = []
    if layout.manifest(key).exists():
        try:
            previous, digest = mf.read(layout.manifest(key))
            sealed = seal.load(layout, key, digest)
        except mf.ManifestError as exc:
            reason = str(exc)
        if previous is not None and previous["scope_key"] != key:
            reason = "manifest belongs to another scope"
        elif previous is not None and signing_key:
            reason = mf.signature_problem(previous, signing_key)
    if reason is None:
        found = _inspect(scope, key, previous["files"] if previous else {}, sealed.dirs)
        broken = [p for p in found.problems if not mf.is_unlisted(p)]
        if not broken:
            return _Committed(previous, found)
        lines = [str(p) for p in broken]
        reason = f"committed files changed since they were saved ({len(broken)})"
    where = scopes.quarantine(layout, key, reason, lines)
    first = f"; first: {lines[0]}" if lines else ""
    gha.warn(f"save: cache scope {key} quarantined ({reason}{first}); moved to {where}")
    raise Refused(reason)


def _merge(overlay_dir: Path, scope: Path, listed: dict[str, Any]) -> list[str]:
    """Move the new files of a private overlay into the scope; their relative paths. A path
    the scope already has (committed, or written by the job that has it in place) is kept,
    and so is a file torch writes in place (never committed: store.in_place)."""
    files, _problems = mf.scan(overlay_dir)
    moved = []
    for rel in in_place.committable(sorted(files)):
        if rel in listed or os.path.lexists(scope / rel):
            continue
        (scope / rel).parent.mkdir(parents=True, exist_ok=True)
        os.rename(overlay_dir / rel, scope / rel)
        moved.append(rel)
    return moved


def _set_aside_unsigned(layout: Layout, key: str, unlisted: list[str], in_place: bool) -> None:
    """A keyed save signs only what its own job compiled into its private overlay: files that
    appeared in the scope itself were written by someone else (or, when the job had the scope
    in place, restored without the key, by a job whose files cannot be told from a planter's).
    They are moved to the quarantine, never signed."""
    why = (
        "written in place by a job restored without FXCACHE_SIGNING_KEY"
        if in_place
        else "appeared in the scope during a keyed job"
    )
    where = scopes.set_aside(layout, key, unlisted, f"unsigned files: {why}")
    gha.warn(
        f"save: {len(unlisted)} file(s) {why}, first {unlisted[0]}: not signed, moved to {where}"
    )


def _new_entries(scope: Path, rels: list[str]) -> tuple[dict[str, Any], dict[str, os.stat_result]]:
    stats = {rel: os.lstat(scope / rel) for rel in rels}
    return mf.file_entries(scope, stats), stats


def _torch_paths(previous: dict[str, Any] | None, state: RestoreState) -> list[str]:
    """The torch installations that have saved into this scope (upgrade invalidation removes a
    scope only when the upgraded installation was its sole user)."""
    paths = set((previous or {}).get("torch_paths") or [])
    if state.torch_path is not None:
        paths.add(state.torch_path)
    return sorted(paths)


def _job_files(
    layout: Layout,
    key: str,
    unlisted: list[str],
    listed: dict[str, Any],
    overlay_dir: Path | None,
    signing_key: str | None,
) -> list[str]:
    """The files this save commits. A job that had the scope in place adds what it wrote
    there (`unlisted`), but for the files torch writes in place; with a key its files are
    only ever those of its private overlay (moved in), and files that appeared in the scope
    itself are set aside, never signed."""
    if signing_key and unlisted:
        _set_aside_unsigned(layout, key, in_place.committable(unlisted), overlay_dir is None)
    if overlay_dir is None:
        return [] if signing_key else in_place.committable(unlisted)
    return _merge(overlay_dir, layout.scope(key), listed)


def _manifest(
    scope: Path,
    key: str,
    state: RestoreState,
    previous: dict[str, Any] | None,
    listed: dict[str, Any],
    signing_key: str | None,
) -> dict[str, Any]:
    """The scope's next manifest: `listed` (committed entries and the new ones), signed with
    the key when there is one."""
    now = scopes.utc_now()
    manifest = {
        "schema": mf.SCHEMA,
        "scope_key": key,
        "fingerprint": state.fingerprint,
        "torch_paths": _torch_paths(previous, state),
        "created_at": (previous or {}).get("created_at") or now,
        "updated_at": now,
        "last_used_at": now,
        "verification": {"references": _verification(scope)},
        "files": dict(sorted(listed.items())),
        "total_bytes": sum(e["size"] for e in listed.values()),
    }
    if signing_key:
        mf.sign(manifest, signing_key)
    return manifest


def _release(layout: Layout, lease: Path | None) -> None:
    if lease is not None:
        scopes.release_lease(layout, lease)


def save(layout: Layout, state: RestoreState, signing_key: str | None) -> Outcome:
    """Add the job's new files to the scope's manifest atomically; the summary and the
    manifest written.

    Only new files are hashed and recorded: committed ones keep their entries. A job that had
    the scope in place adds the unlisted files of the scope; a job that got a private overlay
    (another job had the scope in place) has its overlay's new files moved in. OSError
    propagates to the caller.
    """
    modes.restrict_umask()
    key = state.scope_key
    scope = layout.scope(key)
    overlay_dir, lease = state.overlay_dir, state.lease
    with scopes.lock(layout, key):
        if scope.is_symlink() or not scope.is_dir():
            _release(layout, lease)
            gone = f"scope {key} no longer exists (quarantined?)"
            return Outcome({"saved": False, "reason": gone}, None)
        try:
            previous, found = _committed(layout, key, signing_key)
        except Refused as exc:
            _release(layout, lease)
            return Outcome({"saved": False, "reason": f"scope {key} quarantined: {exc}"}, None)
        committed: dict[str, Any] = dict(previous["files"]) if previous else {}
        # Entries an older save made of files torch writes in place are dropped (in_place).
        listed = {rel: committed[rel] for rel in in_place.committable(committed)}
        unlisted = sorted(p.path for p in found.problems if mf.is_unlisted(p))
        new = _job_files(layout, key, unlisted, listed, overlay_dir, signing_key)
        entries, stats = _new_entries(scope, new)
        listed.update(entries)
        old_versions, dropped = _prune(scope, listed)
        manifest = _manifest(scope, key, state, previous, listed, signing_key)
        mf.make_read_only(scope, stats)
        modes.close_directories(scope, [*new, *found.locks])
        in_place.make_writable(scope, [*found.locks, *committed], modes.file_mode())
        written = mf.Committed.of(manifest)
        digest = _write(layout, key, written)
        # Listed no more: removed once the manifest without them is written.
        references.remove(scope, dropped)
        # What the check listed is sealed for the new manifest, but for directories holding
        # files it does not list (another job's, when this one had an overlay) or that the
        # pruning removed.
        kept_out = {rel.rpartition("/")[0] for rel in set(unlisted) - set(new)}
        kept_out |= {d for d in found.dir_stamps if references.pruned(d + "/", old_versions)}
        seal.refresh(
            layout, key, digest, found.dir_stamps, found.started_ns, seal.NONE,
            mf.listed(manifest), bool(signing_key), kept_out,
        )  # fmt: skip
        _release(layout, lease)
        scopes.touch_last_used(layout, key)
    if overlay_dir is not None:
        scopes.remove_tree(overlay_dir)
    if layout.spares.is_dir() and any(layout.spares.glob(f"{key}.*")):
        spare.build_in_background(layout, key)  # overlays are in use: refresh the spare
    summary = {"saved": True, "scope_key": key, "files": len(manifest["files"]), "added": len(new),
               "bytes": manifest["total_bytes"], "signed": bool(signing_key)}  # fmt: skip
    if old_versions:  # references no run compares any more (store/references.py)
        summary["pruned_references"] = len(old_versions)
    return Outcome(summary, written, tuple(new))


def _prune(scope: Path, listed: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The references no run compares any more (store/references.py), and their files, taken
    out of `listed` (removed from disk once the manifest without them is written)."""
    old_versions = references.beyond_compared(scope, set(listed))
    dropped = [rel for rel in listed if references.pruned(rel, old_versions)]
    for rel in dropped:
        del listed[rel]
    return old_versions, dropped


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


def _write(layout: Layout, key: str, committed: mf.Committed) -> str:
    return mf.write_atomic(layout.manifest(key), committed, layout.root / LOCKS, _fault_hook())


def save_state(layout: Layout, state: RestoreState, signing_key: str | None) -> Outcome:
    """Save the scope restore handed out, or say why not: a read-only restore has nothing to
    save; a local failure (a full disk, a lock not had in time) is one warning."""
    scopes.check_env()
    if state.read_only:
        why = f"read-only restore ({state.read_only_reason})"
        return Outcome({"saved": False, "reason": why}, None)
    try:
        return save(layout, state, signing_key)
    except (OSError, TimeoutError) as exc:
        gha.warn(f"could not save cache scope {state.scope_key}: {exc}; continuing")
        return Outcome({"saved": False, "reason": str(exc)}, None)
