"""Restore: pick the scope of the current fingerprint, check it, hand the job its cache dirs.

Trusted runs get the scope itself (O(1), nothing copied) and a lease that `save` releases;
while another live trusted job has it in place, a private overlay whose new files `save`
merges. Read-only runs get a private overlay of the scope's verified files. A scope that fails any
check is quarantined and the job continues cold; nothing unverified is ever handed out.
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.env.fingerprint import Fingerprint
from ci_fxcache.store import in_place, modes, overlay, scopes, seal, spare, upgrade
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import CACHE_DIRS, Layout
from ci_fxcache.store.state_file import Restored


@dataclass(frozen=True)
class Options:
    """How to restore."""

    read_only: bool = False
    read_only_reason: str | None = None
    invalidate_on_upgrade: bool = True
    full_verify: bool = False
    overlay_strategy: str = "auto"
    signing_key: str | None = None


def private_writes(opts: Options) -> bool:
    """Does a trusted job write into a private overlay instead of the scope itself? Always
    with a signing key: its save then signs only what its own job wrote there, never a file
    that appeared in the scope meanwhile (any writer beside the job could have planted it)."""
    return not opts.read_only and bool(opts.signing_key)


def _overlay_reason(strategy: str, read_only: bool, private: bool) -> str | None:
    """Why a trusted job got an overlay instead of the scope in place (None otherwise)."""
    if strategy in ("in-place", "cold-fallback") or read_only:
        return None
    if private:
        return "signed: its writes stay private until save signs them"
    return "another job has the scope in place"


def full_verification(requested: str | None, signing_key: str | None) -> bool:
    """Re-hash every file on restore? Always with a signing key: a signed scope must never
    pass a content change, whatever the mtime says; otherwise as requested (default fast)."""
    return bool(signing_key) or requested == "full"


@dataclass(frozen=True)
class _Contents:
    """What restore hands out of a verified scope: its files (as the manifest lists them), their
    bytes, and whether the manifest is signed."""

    files: list[str]
    total_bytes: int
    signed: bool


def _contents(listed: mf.Listed, signed: bool) -> _Contents:
    return _Contents(listed.names, sum(listed.sizes), signed)


@dataclass
class _Checked:
    contents: _Contents | None
    busy: bool  # a live trusted job has the scope in place
    quarantined: dict[str, Any] | None = None
    set_aside: dict[str, Any] | None = None
    strategy: str | None = None  # set when a spare overlay was taken


def _problem_of(
    layout: Layout,
    key: str,
    opts: Options,
    served: Path | None = None,
    written: seal.Fresh | None = None,
) -> tuple[str | None, list[mf.Problem], _Contents | None, list[str]]:
    """(reason to quarantine, problems, contents, unsaved files) of scope `key`, checking the
    files of `served` (default: the scope itself) against the scope's manifest; a full check
    of the scope a fetch of this process just `written` stats what it wrote (seal.Fresh)."""
    scope = layout.scope(key) if served is None else served
    if not layout.manifest(key).exists():
        files, problems = mf.scan(scope)
        if problems:
            return "files without a manifest", problems, None, []
        return None, [], None, sorted(files)
    try:
        raw, digest = mf.read_raw(layout.manifest(key))
        sealed = seal.load(layout, key, digest) if served is None else seal.NONE
        # Full verification (always with a signing key) never uses a seal.
        if sealed.listed is not None and not opts.full_verify:
            quick = mf.inspect_listed(scope, sealed.listed, sealed.dirs)
            if quick is not None:  # as sealed: the manifest need not be parsed
                if quick.dir_stamps:  # directories were listed: seal them too
                    seal.refresh(
                        layout, key, digest, quick.dir_stamps, quick.started_ns, sealed,
                        sealed.listed, sealed.signed,
                    )  # fmt: skip
                return None, [], _contents(sealed.listed, sealed.signed), []
        manifest = mf.parse(raw)
        if manifest["scope_key"] != key:
            # A manifest (and its files) carried over from another scope: another environment.
            return f"manifest belongs to scope {manifest['scope_key'][:200]!r}", [], None, []
        if opts.signing_key:
            reason = mf.signature_problem(manifest, opts.signing_key)
            if reason:
                return reason, [], None, []
        listed, signed = mf.listed(manifest), bool(manifest.get("signature"))
        if served is None and written is not None and written.unchanged(scope, digest, manifest):
            return None, [], _contents(listed, signed), []  # checked byte by byte as written
        found = mf.inspect(scope, manifest, opts.full_verify, sealed.dirs, stamp=served is None)
        problems = found.problems
        if not problems and served is None:
            seal.refresh(
                layout, key, digest, found.dir_stamps, found.started_ns, sealed, listed, signed
            )
    except mf.ManifestError as exc:
        return str(exc), [], None, []
    except (ValueError, TypeError, KeyError, RecursionError) as exc:  # never crash on content
        return f"manifest could not be checked: {type(exc).__name__}", [], None, []
    unsaved = [p.path for p in problems if mf.is_unlisted(p)]
    broken = [p for p in problems if not mf.is_unlisted(p)]
    if broken:
        kinds = sorted({p.kind for p in broken})
        return f"{len(broken)} integrity problem(s): {', '.join(kinds)}", broken, None, []
    return None, [], _contents(listed, signed), unsaved


def _from_spare(layout: Layout, key: str, opts: Options, target: Path) -> _Checked | None:
    """An overlay taken from a spare built from the current manifest, checked like a scope;
    None (spare discarded) when there is none or it fails any check."""
    scope = layout.scope(key)
    digest = spare.manifest_digest(layout, key)
    if digest is None or scope.is_symlink() or not scope.is_dir():
        return None
    strategy = spare.take(layout, key, digest, target)
    if strategy is None:
        return None
    reason, _problems, contents, unsaved = _problem_of(layout, key, opts, served=target)
    if reason is not None or unsaved or contents is None:
        scopes.remove_tree(target)
        return None
    return _Checked(contents, False, strategy=strategy)


def _check_scope(
    layout: Layout, key: str, opts: Options, written: seal.Fresh | None = None
) -> _Checked:
    scope = layout.scope(key)
    busy = bool(scopes.live_leases(layout, key, "in-place"))
    reason: str | None
    if scope.is_symlink():
        reason = "the scope directory is a symlink"
        problems = [mf.Problem("symlink", key, f"-> {os.readlink(scope)}")]
    elif not scope.exists():
        return _Checked(None, False)
    else:
        reason, problems, contents, unsaved = _problem_of(layout, key, opts, written=written)
        if reason is None:
            aside = None
            if unsaved and not busy:
                # Files of a trusted job that ended without saving: never verified, so never
                # served, and no sign of tampering with what was committed. Kept aside.
                where = scopes.set_aside(layout, key, unsaved, "unsaved files of a finished job")
                aside = {"files": len(unsaved), "to": str(where)}
                print(
                    f"fxcache: {len(unsaved)} unsaved file(s) of a job that ended without "
                    f"saving moved to {where}",
                    file=sys.stderr,
                )
            return _Checked(contents, busy, None, aside)
    lines = [str(p) for p in problems]
    assert reason is not None
    where = scopes.quarantine(layout, key, reason, lines)
    detail = f"; first: {lines[0]}" if lines else ""
    gha.warn(f"cache scope {key} quarantined ({reason}{detail}); moved to {where}; continuing cold")
    # A live in-place job keeps writing into the fresh scope: others still get overlays.
    return _Checked(None, busy, {"scope": key, "reason": reason, "problems": lines[:20]})


def _checked_scope(
    layout: Layout,
    key: str,
    opts: Options,
    base: Path,
    use_spares: bool,
    private: bool,
    written: seal.Fresh | None = None,
) -> _Checked:
    """Under the scope's lock: the scope checked (a read-only job may take a spare built
    from it instead); a keyed job checks the scope itself first (a changed file quarantines
    it now), then takes a spare, which is checked the same way."""
    checked = None
    if opts.read_only and use_spares:
        checked = _from_spare(layout, key, opts, base)
    if checked is None:
        checked = _check_scope(layout, key, opts, written)
        if private and use_spares and checked.contents is not None:
            taken = _from_spare(layout, key, opts, base)
            if taken is not None:
                checked.contents, checked.strategy = taken.contents, taken.strategy
    return checked


def _overlay(
    layout: Layout, key: str, opts: Options, checked: _Checked, base: Path, private: bool
) -> tuple[str, Path | None]:
    """Under the scope's lock: a private overlay at `base` (taken from a spare, or built);
    its strategy and, for a job that may save, its lease."""
    scope, contents = layout.scope(key), checked.contents
    if checked.strategy is not None:
        strategy = checked.strategy
    else:
        files = sorted(contents.files) if contents else []
        strategy = overlay.build(scope, files, base, opts.overlay_strategy)
    for name in CACHE_DIRS:
        (base / name).mkdir(parents=True, exist_ok=True)
    if private:
        base.chmod(0o700)  # no other user adds files for this job's save to sign
        for name in CACHE_DIRS:  # the scope its save merges into
            (scope / name).mkdir(parents=True, exist_ok=True)
    lease = None if opts.read_only else scopes.take_lease(layout, key, "overlay", base)
    if contents is not None and scope.exists():
        scopes.touch_last_used(layout, key)
    return strategy, lease


def _in_place(layout: Layout, key: str, contents: _Contents | None) -> Path:
    """Under the scope's lock: the scope handed out in place; the lease."""
    scope = layout.scope(key)
    for name in CACHE_DIRS:
        (scope / name).mkdir(parents=True, exist_ok=True)
    lease = scopes.take_lease(layout, key, "in-place")
    scopes.touch_last_used(layout, key)
    if contents is not None:  # locks an older save made read-only
        in_place.make_writable(scope, contents.files, modes.file_mode())
    return lease


def restore(
    layout: Layout, key: str, fp: Fingerprint, opts: Options, written: seal.Fresh | None = None
) -> Restored:
    """Run the restore; what it handed out (see docs/store.md). `written`: what a fetch of
    this process vouches for, having just put the scope in place (seal.Fresh).

    A trusted job gets the scope in place unless another live trusted job has it in place;
    then it gets a private overlay whose new files its `save` merges into the scope.
    """
    modes.restrict_umask()
    layout.root.mkdir(parents=True, exist_ok=True)
    invalidated: list[dict[str, Any]] = []
    if opts.invalidate_on_upgrade and not opts.read_only:
        invalidated = upgrade.remove_stale(layout, key, fp)
    base = layout.overlays / f"{key}.{uuid.uuid4().hex[:12]}"
    use_spares = opts.overlay_strategy == "auto"
    private = private_writes(opts)
    scope = layout.scope(key)
    with scopes.lock(layout, key):
        checked = _checked_scope(layout, key, opts, base, use_spares, private, written)
        if not opts.read_only and not checked.busy and not private:
            lease: Path | None = _in_place(layout, key, checked.contents)
            base, strategy = scope, "in-place"
        else:
            strategy, lease = _overlay(layout, key, opts, checked, base, private)
    contents = checked.contents
    if base != scope and use_spares and contents is not None:
        spare.build_in_background(layout, key)  # the next overlay restore is a rename
    return Restored(
        root=layout.root, scope_key=key, hit=contents is not None and bool(contents.files),
        read_only=opts.read_only, read_only_reason=opts.read_only_reason, mode=strategy,
        overlay_reason=_overlay_reason(strategy, opts.read_only, private), scope_dir=scope,
        inductor_dir=base / "inductor", triton_dir=base / "triton", verify_dir=base / "verify",
        overlay_dir=base if base != scope else None, spare=checked.strategy is not None,
        files=len(contents.files) if contents else 0,
        bytes=contents.total_bytes if contents else 0,
        verify_mode="full" if opts.full_verify else "fast",
        signed=bool(contents and contents.signed), signature_checked=bool(opts.signing_key),
        invalidated=tuple(invalidated), set_aside=checked.set_aside,
        quarantined=(checked.quarantined,) if checked.quarantined else (),
        lease=lease, fingerprint=fp.to_dict(), restored_at=scopes.utc_now(), pid=os.getpid(),
    )  # fmt: skip
