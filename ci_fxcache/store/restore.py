"""Restore: pick the scope of the current fingerprint, check it, hand the job its cache dirs.

Trusted runs get the scope itself (O(1), nothing copied) and a lease that `save` releases.
Read-only runs get a private overlay of the scope's verified files. A scope that fails any
check is quarantined and the job continues cold; nothing unverified is ever handed out.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.fingerprint import Fingerprint
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import overlay, scopes, upgrade
from ci_fxcache.store.layout import CACHE_DIRS, Layout

STATE_SCHEMA = "fxcache-cache-state/1"


@dataclass(frozen=True)
class Options:
    """How to restore."""

    read_only: bool = False
    read_only_reason: str | None = None
    invalidate_on_upgrade: bool = True
    full_verify: bool = False
    overlay_strategy: str = "auto"
    signing_key: str | None = None


@dataclass
class _Checked:
    manifest: dict[str, Any] | None
    busy: bool  # a live in-place writer has unsaved files in the scope
    quarantined: dict[str, Any] | None


def _check_scope(layout: Layout, key: str, opts: Options) -> _Checked:
    scope = layout.scope(key)
    if not scope.exists():
        return _Checked(None, False, None)
    reason: str | None = None
    problems: list[mf.Problem] = []
    manifest: dict[str, Any] | None = None
    busy = False
    if not layout.manifest(key).exists():
        files, problems = mf.scan(scope)
        if not files and not problems:
            return _Checked(None, False, None)  # a fresh scope nobody has saved yet
        if not problems and scopes.live_leases(layout, key):
            return _Checked(None, True, None)
        reason = "files without a manifest"
    else:
        try:
            manifest = mf.load(layout.manifest(key))
        except mf.ManifestError as exc:
            reason = str(exc)
        if manifest is not None and manifest.get("scope_key") != key:
            # A manifest (and its files) carried over from another scope: another environment.
            reason = f"manifest belongs to scope {manifest.get('scope_key')!r}"
        elif manifest is not None and opts.signing_key:
            reason = mf.signature_problem(manifest, opts.signing_key)
        if manifest is not None and reason is None:
            problems = mf.check(scope, manifest, opts.full_verify)
            pending = [p for p in problems if p.kind == "unexpected" and "/" in p.path]
            if pending and len(pending) == len(problems) and scopes.live_leases(layout, key):
                # Another trusted job restored in place and has not saved yet: its new files
                # are not verified, so this job gets an overlay of the verified ones only.
                return _Checked(manifest, True, None)
            if problems:
                kinds = sorted({p.kind for p in problems})
                reason = f"{len(problems)} integrity problem(s): {', '.join(kinds)}"
    if reason is None:
        return _Checked(manifest, busy, None)
    lines = [str(p) for p in problems]
    where = scopes.quarantine(layout, key, reason, lines)
    detail = f"; first: {lines[0]}" if lines else ""
    gha.warn(f"cache scope {key} quarantined ({reason}{detail}); moved to {where}; continuing cold")
    return _Checked(None, False, {"scope": key, "reason": reason, "problems": lines[:20]})


def restore(layout: Layout, key: str, fp: Fingerprint, opts: Options) -> dict[str, Any]:
    """Run the restore; return the state object (see docs/contracts.md)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    invalidated: list[dict[str, Any]] = []
    if opts.invalidate_on_upgrade and not opts.read_only:
        invalidated = upgrade.remove_stale(layout, key, fp)
    read_only, ro_reason = opts.read_only, opts.read_only_reason
    lease: Path | None = None
    quarantined: list[dict[str, Any]] = []
    with scopes.lock(layout, key):
        checked = _check_scope(layout, key, opts)
        if checked.quarantined:
            quarantined.append(checked.quarantined)
        manifest = checked.manifest
        if checked.busy and not read_only:
            read_only, ro_reason = True, "another job is writing this scope and has not saved"
        scope = layout.scope(key)
        if not read_only:
            for name in CACHE_DIRS:
                (scope / name).mkdir(parents=True, exist_ok=True)
            lease = scopes.take_lease(layout, key)
            scopes.touch_last_used(layout, key)
            base, strategy = scope, "in-place"
        else:
            files = sorted(manifest["files"]) if manifest else []
            base = layout.overlays / f"{key}.{uuid.uuid4().hex[:12]}"
            strategy = overlay.build(scope, files, base, opts.overlay_strategy)
            for name in CACHE_DIRS:
                (base / name).mkdir(parents=True, exist_ok=True)
            if manifest is not None and scope.exists():
                scopes.touch_last_used(layout, key)
    files_meta = manifest["files"] if manifest else {}
    return {
        "schema": STATE_SCHEMA,
        "store": "local",
        "root": str(layout.root),
        "scope_key": key,
        "hit": manifest is not None and bool(files_meta),
        "read_only": read_only,
        "read_only_reason": ro_reason,
        "mode": strategy,
        "scope_dir": str(scope),
        "inductor_dir": str(base / "inductor"),
        "triton_dir": str(base / "triton"),
        "verify_dir": str(base / "verify"),
        "overlay_dir": str(base) if read_only else None,
        "files": len(files_meta),
        "bytes": sum(int(m["size"]) for m in files_meta.values()),
        "verify_mode": "full" if opts.full_verify else "fast",
        "signed": bool(manifest and manifest.get("signature")),
        "signature_checked": bool(opts.signing_key),
        "invalidated": invalidated,
        "quarantined": quarantined,
        "lease": str(lease) if lease else None,
        "fingerprint": fp.to_dict(),
        "restored_at": scopes.utc_now(),
        "pid": os.getpid(),
    }
