"""Private copy-on-write overlays for read-only restores.

Each verified file of the scope appears in the overlay as a reflink (a true copy-on-write clone,
on btrfs / XFS / overlay filesystems that support FICLONE), else a hardlink, else a copy:

- reflink: writes to the clone never reach the scope.
- hardlink: shares the inode. Committed scope files are read-only (mode 0444, set by `save`), so
  an in-place write by an unprivileged job fails with EACCES instead of altering the scope, and
  Inductor / Triton replace files by rename, which only changes the overlay's directory entry.
  Root ignores file modes, so `auto` never hardlinks for root.
- copy: always safe, costs the bytes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

STRATEGIES = ("auto", "reflink", "hardlink", "copy")
_FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}


def _reflink(src: Path, dst: Path) -> None:
    with src.open("rb") as fsrc, dst.open("wb") as fdst:
        try:
            fcntl.ioctl(fdst.fileno(), _FICLONE, fsrc.fileno())
        except OSError:
            dst.unlink(missing_ok=True)
            raise
    shutil.copystat(src, dst)


def _copy(src: Path, dst: Path) -> None:
    shutil.copy2(src, dst)


def _hardlink(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
            raise
        _copy(src, dst)


def build(source: Path, files: list[str], target: Path, strategy: str = "auto") -> str:
    """Populate `target` with `files` (paths relative to `source`); return the strategy used."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown overlay strategy {strategy!r}")
    target.mkdir(parents=True, exist_ok=True)
    chosen = strategy
    for rel in files:
        src, dst = source / rel, target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if chosen in ("auto", "reflink"):
            try:
                _reflink(src, dst)
                chosen = "reflink"
                continue
            except OSError as exc:
                if exc.errno not in _NO_REFLINK or strategy == "reflink":
                    raise
                chosen = "hardlink" if os.geteuid() != 0 else "copy"
        if chosen == "hardlink":
            _hardlink(src, dst)
        else:
            _copy(src, dst)
    if chosen == "auto":  # no files at all
        chosen = "empty"
    return chosen
