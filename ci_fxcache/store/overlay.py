"""Private copy-on-write overlays for read-only restores.

Each verified file of the scope appears in the overlay as a reflink (a true copy-on-write clone,
on btrfs / XFS / overlay filesystems that support FICLONE), else a hardlink, else a copy:

- reflink: writes to the clone never reach the scope.
- hardlink: shares the inode. Committed scope files are read-only (mode 0444, set by `save`), so
  an in-place write by an unprivileged job fails with EACCES instead of altering the scope, and
  Inductor / Triton replace files by rename, which only changes the overlay's directory entry.
  Root ignores file modes, so `auto` never hardlinks for root.
- copy: always safe, costs the bytes.

Files torch writes in place (store.in_place) are never shared: lock files are not placed (torch
creates its own), and any other such file an older save committed is copied, writable.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from ci_fxcache.store import forked, in_place

STRATEGIES = ("auto", "reflink", "hardlink", "copy")
# Below this many directories a fork costs more than it saves.
_MIN_DIRS_PER_WORKER = 2048
_FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}


def _reflink(src: str, dst: str) -> None:
    with open(src, "rb") as fsrc, open(dst, "wb") as fdst:
        try:
            fcntl.ioctl(fdst.fileno(), _FICLONE, fsrc.fileno())
        except OSError:
            os.unlink(dst)
            raise
    shutil.copystat(src, dst)


def _hardlink(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
            raise
        shutil.copy2(src, dst)


def _make_dirs(root: str, directories: list[str]) -> None:
    for directory in directories:
        os.makedirs(os.path.join(root, directory), exist_ok=True)


def _make_tree(root: str, directories: list[str]) -> None:
    """Create `directories` (relative, sorted) under `root`. Most of an overlay build is this:
    Inductor puts nearly every entry in a directory of its own, and each mkdir cost 35-380 us
    of kernel time on the ext4 we measured (its allocator). mkdirs in one parent serialise on
    the parent's lock, so the work is spread over processes by parent directory (store.forked;
    measured 1.25-1.4x on 2 cores with the benchmark's two big parents)."""
    groups: dict[str, list[str]] = {}
    for directory in directories:
        groups.setdefault(directory.rpartition("/")[0], []).append(directory)
    count = min(forked.workers(len(directories), _MIN_DIRS_PER_WORKER), len(groups))
    if count <= 1:
        _make_dirs(root, directories)
        return
    _make_dirs(root, sorted(groups))  # every parent first: the shares only add children
    shares: list[list[str]] = [[] for _ in range(count)]
    for group in sorted(groups.values(), key=len, reverse=True):
        min(shares, key=len).extend(group)
    answers = forked.run(shares, lambda share: _make_dirs(root, share))
    for share, answer in zip(shares, answers, strict=True):
        if answer is forked.FAILED:  # the child failed: make its share here
            _make_dirs(root, share)


def make_parents(root: str, files: Iterable[str]) -> None:
    """Create, under `root`, every directory the relative paths `files` need (`_make_tree`)."""
    _make_tree(root, sorted({rel.rpartition("/")[0] for rel in files}))


def build(source: Path, files: list[str], target: Path, strategy: str = "auto") -> str:
    """Populate `target` with `files` (paths relative to `source`); return the strategy used.
    A path that is not inside a cache dir (a hostile seal's list: see store.seal) is skipped:
    never placed, so never written outside `target`; the job misses that entry. A build that
    fails (a full disk) removes the `target` it created before the error propagates."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown overlay strategy {strategy!r}")
    created = not os.path.lexists(target)
    try:
        return _build(str(source), files, str(target), strategy)
    except BaseException:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        raise


def _build(src_root: str, files: list[str], dst_root: str, strategy: str) -> str:
    from ci_fxcache.store.manifest import safe_relpath  # not at the top: restore imports this

    files = [rel for rel in files if safe_relpath(rel) and not in_place.is_lock(rel)]
    own = [rel for rel in files if in_place.written_in_place(rel)]
    files = [rel for rel in files if not in_place.written_in_place(rel)]
    os.makedirs(dst_root, exist_ok=True)
    make_parents(dst_root, files + own)
    chosen = strategy
    if chosen in ("auto", "reflink") and files:
        # Probe once: a filesystem either clones or it does not.
        first = files[0]
        try:
            _reflink(os.path.join(src_root, first), os.path.join(dst_root, first))
            chosen, files = "reflink", files[1:]
        except OSError as exc:
            if exc.errno not in _NO_REFLINK or strategy == "reflink":
                raise
            chosen = "hardlink" if os.geteuid() != 0 else "copy"
    placers: dict[str, Callable[[str, str], object]] = {
        "reflink": _reflink,
        "hardlink": _hardlink,
        "copy": shutil.copy2,
    }
    for rel in own:
        dst = os.path.join(dst_root, rel)
        shutil.copy2(os.path.join(src_root, rel), dst)
        os.chmod(dst, os.stat(dst).st_mode | 0o200)
    place = placers.get(chosen)
    if place is None:  # auto with no files at all
        return "copy" if own else "empty"
    for rel in files:
        place(os.path.join(src_root, rel), os.path.join(dst_root, rel))
    return chosen
