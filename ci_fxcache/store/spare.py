"""Spare overlays: a private overlay of a scope built ahead of time, so an overlay restore is
a rename instead of thousands of mkdir + link calls.

Building an overlay of a large scope is dominated by creating its directories (Inductor puts
nearly every entry in a directory of its own). A spare is built in the background after a
save or after a restore used one, named after the exact manifest it was built from
(`.spares/<key>.<manifest sha256[:16]>.<strategy>`), and taken by an atomic rename. A spare
is served only after it passes the same integrity check against the manifest as a scope.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from contextlib import suppress
from pathlib import Path

from ci_fxcache import names
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import modes, overlay, scopes
from ci_fxcache.store.layout import CACHE_DIRS, Layout


def manifest_digest(layout: Layout, key: str) -> str | None:
    """The first 16 hex digits of the sha256 of the scope's manifest file, or None."""
    try:
        return mf.read_raw(layout.manifest(key))[1][:16]
    except (mf.ManifestError, PermissionError):
        return None


def take(layout: Layout, key: str, digest: str, target: Path) -> str | None:
    """Move a spare built from the manifest with `digest` to `target`; its strategy or None."""
    if not layout.spares.is_dir():
        return None
    for path in layout.spares.glob(f"{key}.{digest}.*"):
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, target)
        except OSError:
            continue  # another restore took it first
        return path.name.rsplit(".", 1)[1]
    return None


def build(layout: Layout, key: str) -> Path | None:
    """Build a spare of the scope's current manifest (unless one exists); where, or None."""
    modes.restrict_umask()
    digest = manifest_digest(layout, key)
    if digest is None or layout.scope(key).is_symlink():
        return None
    if layout.spares.is_dir() and any(layout.spares.glob(f"{key}.{digest}.*")):
        return None
    try:
        manifest = mf.load(layout.manifest(key))
    except (mf.ManifestError, PermissionError):
        return None
    work = layout.overlays / f".spare-build-{uuid.uuid4().hex[:12]}"
    try:
        strategy = overlay.build(layout.scope(key), sorted(manifest["files"]), work, "auto")
        for name in CACHE_DIRS:
            (work / name).mkdir(parents=True, exist_ok=True)
        if manifest_digest(layout, key) != digest:
            return None  # saved meanwhile: this spare is already out of date
        layout.spares.mkdir(parents=True, exist_ok=True)
        for old in layout.spares.glob(f"{key}.*"):
            scopes.remove_tree(old)
        final = layout.spares / f"{key}.{digest}.{strategy}"
        os.rename(work, final)
        return final
    except OSError:
        return None
    finally:
        scopes.remove_tree(work)


def build_in_background(layout: Layout, key: str) -> None:
    """Start a detached process that builds the next spare of `key` (best effort)."""
    with suppress(OSError):
        subprocess.Popen(
            # -I: nothing from the job's working directory (a json.py) runs in it
            [sys.executable, "-I", "-m", "ci_fxcache.store.spare", str(layout.root), key],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            env=names.without_secrets(),
        )


if __name__ == "__main__":
    build(Layout(Path(sys.argv[1])), sys.argv[2])
