"""Operations on whole scopes: size, last use, leases, quarantine, removal, locking."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ci_fxcache import gha, names, userfiles
from ci_fxcache.errors import UsageError
from ci_fxcache.store import manifest, seal
from ci_fxcache.store.layout import LAST_USED, LEASES, MANIFEST, Layout
from ci_fxcache.timestamps import utc_now

LEASE_TTL_ENV = "FXCACHE_LEASE_TTL"
DEFAULT_LEASE_TTL_S = 6 * 3600
LOCK_TIMEOUT_ENV = "FXCACHE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 300.0


@contextmanager
def lock(layout: Layout, key: str) -> Iterator[None]:
    """The per-scope lock: an exclusive flock on `<root>/.locks/<key>.lock`, waited for at most
    FXCACHE_LOCK_TIMEOUT seconds (then TimeoutError). The kernel releases it when the holder
    exits or dies. The lock file is never truncated, and never followed if it is a symlink
    (OSError: a planted link cannot make a job open another file).

    Not the filelock package: importing it took 18-31 ms (asyncio included) of every restore,
    the toolkit is POSIX-only anyway (fcntl), and this is all of it that the store used."""
    path = layout.lock(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    timeout = lock_timeout()
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        deadline, pause = time.monotonic() + timeout, 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"scope lock {path} still held by another job after {timeout:g} s "
                        f"({LOCK_TIMEOUT_ENV})"
                    ) from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.2)
        yield
    finally:
        os.close(fd)  # releases the lock


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return userfiles.duration_seconds(raw)
    except UsageError as exc:
        raise UsageError(f"{name}={exc}: fix or unset it") from None


def lock_timeout() -> float:
    """Seconds to wait for a scope's lock (env FXCACHE_LOCK_TIMEOUT); UsageError when bad."""
    return _env_seconds(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_S)


def check_env() -> None:
    """Fail early, as a usage error, on a malformed FXCACHE_LOCK_TIMEOUT / FXCACHE_LEASE_TTL."""
    lock_timeout()
    lease_ttl()


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (symlinks not followed)."""
    return sum(st.st_size for st in manifest.regular_files(path))


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
    """Seconds after which an unsaved in-place restore no longer counts as a live writer, even
    when its owner cannot be checked (another host); env FXCACHE_LEASE_TTL."""
    return _env_seconds(LEASE_TTL_ENV, DEFAULT_LEASE_TTL_S)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (tells a reused pid apart)."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


# Processes that live exactly as long as a job: the runner's job worker, act's own process.
_JOB_PROCESSES = frozenset({"Runner.Worker", "act"})
HOLD_POLL_S = 1.0


def lease_owner() -> int | None:
    """The process whose end ends the job: inside Actions the runner's job worker
    (Runner.Worker; each step's shell exits at once) or `act`, elsewhere the process that ran
    us.

    None inside Actions when neither is among our ancestors (a container job's steps, another
    runner implementation): no process there outlives the job's steps, and the lease is dead
    when its holder is (see `take_lease`)."""
    parent = os.getppid()
    if not gha.in_actions():
        return parent
    pid = parent
    for _ in range(64):
        with suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() in _JOB_PROCESSES:
                return pid
        fields = _proc_stat(pid)
        if not fields or int(fields[1]) <= 1:
            break
        pid = int(fields[1])
    return None


def _held(path: Path) -> bool | None:
    """Whether the lease file is flocked by its holder; None when it cannot be probed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)


def _lease_alive(path: Path, now: float) -> bool:
    """A held lease (see `take_lease`) is alive exactly while its holder holds its flock,
    whatever its content (it may be empty: written on a full disk). An older lease: while its
    owner process lives, or, where that cannot be checked, for the TTL."""
    try:
        age = now - path.stat().st_mtime
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    held = _held(path)
    if not text:  # written on a full disk: only its lock says anything
        return bool(held)
    try:
        info = json.loads(text)
    except ValueError:
        return bool(held)
    if age > lease_ttl() or not isinstance(info, dict):
        return False
    if info.get("held") and not held:
        return False  # its holder is gone: the job ended (a container torn down, a kill -9)
    # The owner, where it can be checked, ends the job at once (the holder notices it later).
    pid, start = info.get("owner_pid"), info.get("owner_start")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int) or start is None:
        return True  # cannot check from here: the TTL decides
    return process_start(pid) == start


def live_leases(layout: Layout, key: str, mode: str | None = None) -> list[Path]:
    """Leases of restores that may still write for `key` (optionally of one mode: `in-place`
    or `overlay`). A lease whose job ended is removed."""
    directory = layout.leases(key)
    if not directory.is_dir():
        return []
    live = []
    now = time.time()
    for path in directory.glob("*.json"):
        if not _lease_alive(path, now):
            path.unlink(missing_ok=True)
            continue
        # A lease without a readable mode (written on a full disk) counts as any.
        if mode is not None:
            with suppress(OSError, ValueError, AttributeError):
                if json.loads(path.read_text(encoding="utf-8")).get("mode") != mode:
                    continue
        live.append(path)
    return live


def take_lease(layout: Layout, key: str, mode: str, overlay: Path | None = None) -> Path:
    """Register a trusted restore of `key` (`in-place` or `overlay`); `save` releases it.

    The lease file is flocked by a small holder process started from here (store.holder: a
    fresh interpreter without the job's secrets), which lives as long as the job: it exits
    when the lease is released (removed), when the owner process ends (`lease_owner`), or
    after the TTL; it dies with its container or with a kill of the job's
    processes, and the kernel then drops its lock. So the lease of a job that ended without
    saving is dead at the next restore, on any host or container that sees the store, with or
    without an owner pid. The lease's content says who it is (best effort: on a full disk the
    file stays empty, and is still held)."""
    directory = layout.leases(key)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{uuid.uuid4().hex}.json"
    owner = lease_owner()
    start = process_start(owner) if owner is not None else None
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        holder = _fork_holder(fd, owner, start)
        info = {
            "created_at": utc_now(),
            "mode": mode,
            "host": socket.gethostname(),
            "owner_pid": owner,
            "owner_start": start,
            "holder_pid": holder,
            "held": holder is not None,
            "overlay": str(overlay) if overlay is not None else None,
            "run_id": os.environ.get("GITHUB_RUN_ID"),
            "job": os.environ.get("GITHUB_JOB"),
        }
        with suppress(OSError):  # ENOSPC: the held, empty lease still counts
            os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))
    finally:
        os.close(fd)  # the holder keeps the lock
    return path


def release_lease(layout: Layout, path: Path) -> None:
    """End a lease (its holder sees it removed and exits); a path that is not a lease of this
    store is left alone."""
    if path.suffix == ".json" and path.parent.parent == layout.root / LEASES:
        path.unlink(missing_ok=True)


def _fork_holder(fd: int, owner: int | None, start: str | None) -> int | None:
    """Start the process that keeps `fd`'s flock while the job lives (store.holder): a fresh
    interpreter, in a session of its own, that gets nothing of ours but the lease and an
    environment without secrets; its pid (None: it could not be started)."""
    try:
        proc = subprocess.Popen(
            # -I: nothing from the job's working directory (a json.py) runs in it
            [sys.executable, "-I", "-m", "ci_fxcache.store.holder", str(fd),
             "" if owner is None else str(owner), start or "", repr(lease_ttl())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(fd,),
            env=names.without_secrets(),
        )  # fmt: skip
    except (OSError, ValueError):
        return None
    return proc.pid


def leased_overlays(layout: Layout, key: str) -> tuple[set[str], set[str]]:
    """(overlays named by a live lease of `key`, overlays named by any lease of it): an
    overlay whose lease is dead belongs to a job that ended."""
    alive: set[str] = set()
    named: set[str] = set()
    directory = layout.leases(key)
    if not directory.is_dir():
        return alive, named
    now = time.time()
    for path in directory.glob("*.json"):
        with suppress(OSError, ValueError, AttributeError):
            overlay = json.loads(path.read_text(encoding="utf-8")).get("overlay")
            if isinstance(overlay, str):
                named.add(overlay)
                if _lease_alive(path, now):
                    alive.add(overlay)
    return alive, named


def _aside(layout: Layout, key: str, suffix: str = "") -> Path:
    layout.quarantine.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return layout.quarantine / f"{key}.{stamp}.{os.getpid()}-{uuid.uuid4().hex[:6]}{suffix}"


def _write_note(target: Path, note: dict[str, Any]) -> None:
    """The note beside a quarantined entry (best effort: moving it aside needs no free space,
    the note does)."""
    with suppress(OSError):
        (target.parent / f"{target.name}.json").write_text(
            json.dumps(note, indent=1) + "\n", encoding="utf-8"
        )


def set_aside(layout: Layout, key: str, rels: list[str], reason: str) -> Path:
    """Move unsaved files (relative paths) of a scope into `.quarantine/` for inspection."""
    target = _aside(layout, key, "-unsaved")
    scope = layout.scope(key)
    for rel in rels:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileNotFoundError):
            os.rename(scope / rel, dest)
    _write_note(target, {"scope": key, "reason": reason, "files": rels[:200], "at": utc_now()})
    return target


def quarantine(layout: Layout, key: str, reason: str, problems: list[str]) -> Path:
    """Move the scope aside into `<root>/.quarantine/` with a note saying why; return where."""
    target = _aside(layout, key)
    os.rename(layout.scope(key), target)
    drop_derived(layout, key)
    note = {"scope": key, "reason": reason, "problems": problems[:200], "at": utc_now()}
    _write_note(target, note)
    return target


def remove(layout: Layout, key: str) -> int:
    """Delete a scope (renamed aside first, so no half-removed scope is ever visible); bytes."""
    scope = layout.scope(key)
    size = tree_bytes(scope)
    trash = layout.root / f".trash-{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    os.rename(scope, trash)
    _rmtree(trash)
    shutil.rmtree(layout.leases(key), ignore_errors=True)
    drop_derived(layout, key)
    return size


def drop_derived(layout: Layout, key: str) -> None:
    """Remove what is derived from the files of `key`, its spare overlays and its seal (the
    files were moved or removed)."""
    seal.drop(layout, key)
    if layout.spares.is_dir():
        for path in layout.spares.glob(f"{key}.*"):
            remove_tree(path)


def _rmtree(path: Path) -> None:
    def make_writable(func: Any, target: str, _exc: object) -> None:
        if not os.path.lexists(target):
            return
        os.chmod(os.path.dirname(target), 0o755)
        func(target)

    shutil.rmtree(path, onerror=make_writable)


def remove_tree(path: Path) -> None:
    """Remove a directory tree (overlays, quarantined scopes), ignoring what is already gone."""
    if path.exists():
        _rmtree(path)
