"""Operations on whole scopes: size, last use, leases, quarantine, removal, locking."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from contextlib import AbstractContextManager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ci_fxcache.store.layout import LAST_USED, MANIFEST, Layout

LEASE_TTL_ENV = "FXCACHE_LEASE_TTL"
DEFAULT_LEASE_TTL_S = 6 * 3600
LOCK_TIMEOUT_ENV = "FXCACHE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 300.0


def utc_now() -> str:
    """Now, as an ISO 8601 UTC timestamp with a Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def lock(layout: Layout, key: str) -> AbstractContextManager[Any]:
    """The per-scope lock (a filelock in `<root>/.locks/`), with a bounded wait."""
    from filelock import FileLock

    path = layout.lock(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    timeout = float(os.environ.get(LOCK_TIMEOUT_ENV) or DEFAULT_LOCK_TIMEOUT_S)
    return FileLock(str(path), timeout=timeout)


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (symlinks not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_size
    return total


def last_used(layout: Layout, key: str) -> float:
    """Epoch seconds of the scope's last restore or save (0 when unknown)."""
    scope = layout.scope(key)
    times = []
    for name in (LAST_USED, MANIFEST):
        with suppress(OSError):
            times.append((scope / name).stat().st_mtime)
    return max(times, default=0.0)


def touch_last_used(layout: Layout, key: str) -> None:
    """Record a use of the scope (the mtime of `<scope>/.last-used`)."""
    path = layout.scope(key) / LAST_USED
    path.touch()
    os.utime(path)


def lease_ttl() -> float:
    """Seconds after which an unsaved in-place restore no longer counts as a live writer."""
    return float(os.environ.get(LEASE_TTL_ENV) or DEFAULT_LEASE_TTL_S)


def live_leases(layout: Layout, key: str) -> list[Path]:
    """Leases of trusted in-place restores that may still be writing the scope; drops old ones."""
    directory = layout.leases(key)
    if not directory.is_dir():
        return []
    live = []
    now = time.time()
    for path in directory.glob("*.json"):
        try:
            age = now - path.stat().st_mtime
        except OSError:
            continue
        if age > lease_ttl():
            path.unlink(missing_ok=True)
        else:
            live.append(path)
    return live


def take_lease(layout: Layout, key: str) -> Path:
    """Register a trusted in-place restore of `key`; `save` releases it."""
    directory = layout.leases(key)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{uuid.uuid4().hex}.json"
    info = {
        "created_at": utc_now(),
        "host": socket.gethostname(),
        "pid": os.getppid(),
        "run_id": os.environ.get("GITHUB_RUN_ID"),
        "job": os.environ.get("GITHUB_JOB"),
    }
    path.write_text(json.dumps(info) + "\n", encoding="utf-8")
    return path


def quarantine(layout: Layout, key: str, reason: str, problems: list[str]) -> Path:
    """Move the scope aside into `<root>/.quarantine/` with a note saying why; return where."""
    layout.quarantine.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = layout.quarantine / f"{key}.{stamp}.{os.getpid()}"
    os.rename(layout.scope(key), target)
    note = {"scope": key, "reason": reason, "problems": problems[:200], "at": utc_now()}
    (target.parent / f"{target.name}.json").write_text(
        json.dumps(note, indent=1) + "\n", encoding="utf-8"
    )
    return target


def remove(layout: Layout, key: str) -> int:
    """Delete a scope (renamed aside first, so no half-removed scope is ever visible); bytes."""
    scope = layout.scope(key)
    size = tree_bytes(scope)
    trash = layout.root / f".trash-{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    os.rename(scope, trash)
    _rmtree(trash)
    shutil.rmtree(layout.leases(key), ignore_errors=True)
    return size


def _rmtree(path: Path) -> None:
    def make_writable(func: Any, target: str, _exc: object) -> None:
        os.chmod(os.path.dirname(target), 0o755)
        func(target)

    shutil.rmtree(path, onerror=make_writable)


def remove_tree(path: Path) -> None:
    """Remove a directory tree (overlays, quarantined scopes), ignoring what is already gone."""
    if path.exists():
        _rmtree(path)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
