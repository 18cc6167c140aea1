"""Where things live in a store root; no I/O beyond path arithmetic and directory listing."""

from __future__ import annotations

import os
from pathlib import Path

from ci_fxcache import gha
from ci_fxcache.env import scopekey

CACHE_DIRS = ("inductor", "triton", "verify")
# restore exports the scope's verify/ folder as verify's default --cache-dir
VERIFY_DIR_ENV = "FXCACHE_VERIFY_DIR"
MANIFEST = "manifest.json"
LAST_USED = ".last-used"
# Top-level entries a scope directory may hold; anything else is unexpected.
SCOPE_ENTRIES = frozenset({MANIFEST, LAST_USED, *CACHE_DIRS})
QUARANTINE = ".quarantine"
LOCKS = ".locks"
LEASES = ".leases"
OVERLAYS = ".overlays"
SPARES = ".spares"
SEALS = ".seals"
# The trust namespace of runs that read a remote tier they may not write (a pull request's
# under `save: auto`): a store root of its own inside the shared one, where such a run
# restores, fetches and commits. No run that writes the remote tier reads or publishes it,
# so what an unreviewed branch compiled never reaches the remote (docs/security.md).
REMOTE_READERS = ".remote-readers"


def default_root() -> Path:
    """`$FXCACHE_ROOT`, else `$RUNNER_TOOL_CACHE/fxcache` inside Actions, else ~/.cache/fxcache."""
    env = os.environ.get("FXCACHE_ROOT")
    if env:
        return Path(env).expanduser()
    tool_cache = os.environ.get("RUNNER_TOOL_CACHE")
    if gha.in_actions() and tool_cache:
        return Path(tool_cache) / "fxcache"
    return Path.home() / ".cache" / "fxcache"


def resolve_root(value: Path | None) -> Path:
    """The root from --root, else `default_root()`."""
    return value if value is not None else default_root()


def trust_root(root: Path, *, may_write_remote: bool) -> Path:
    """The store root of a run's trust namespace in shared root `root`: `root` itself for a
    run that may write the remote tier (or has none), its REMOTE_READERS namespace for one
    that only reads it. Idempotent: a namespace's root maps to itself."""
    if may_write_remote or root.name == REMOTE_READERS:
        return root
    return root / REMOTE_READERS


class Layout:
    """Paths inside one store root."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()

    def scope(self, key: str) -> Path:
        """The directory of scope `key`."""
        return self.root / key

    def manifest(self, key: str) -> Path:
        """The manifest of scope `key`."""
        return self.root / key / MANIFEST

    def lock(self, key: str) -> Path:
        """The lock file that serialises writers of scope `key`."""
        return self.root / LOCKS / f"{key}.lock"

    def leases(self, key: str) -> Path:
        """The lease directory of scope `key` (one file per unsaved in-place restore)."""
        return self.root / LEASES / key

    def seal(self, key: str) -> Path:
        """The seal of scope `key`: which directories a clean check listed, and the manifest's
        file list (see store.seal)."""
        return self.seals / f"{key}.json"

    @property
    def seals(self) -> Path:
        """Where seals live (see store.seal)."""
        return self.root / SEALS

    @property
    def quarantine(self) -> Path:
        """Where failed scopes are moved."""
        return self.root / QUARANTINE

    @property
    def overlays(self) -> Path:
        """Where private overlays of read-only restores are made."""
        return self.root / OVERLAYS

    @property
    def spares(self) -> Path:
        """Where overlays built ahead of time wait for a restore (see store.spare)."""
        return self.root / SPARES

    def scope_keys(self) -> list[str]:
        """Names of the scope directories of our key format in this root, sorted."""
        if not self.root.is_dir():
            return []
        keys = []
        for entry in os.scandir(self.root):
            if entry.is_dir(follow_symlinks=False) and scopekey.parse(entry.name) is not None:
                keys.append(entry.name)
        return sorted(keys)
