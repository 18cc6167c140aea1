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
from collections.abc import Callable
from pathlib import Path

STRATEGIES = ("auto", "reflink", "hardlink", "copy")
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


def build(source: Path, files: list[str], target: Path, strategy: str = "auto") -> str:
    """Populate `target` with `files` (paths relative to `source`); return the strategy used."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown overlay strategy {strategy!r}")
    src_root, dst_root = str(source), str(target)
    os.makedirs(dst_root, exist_ok=True)
    for directory in sorted({rel.rpartition("/")[0] for rel in files}):
        os.makedirs(os.path.join(dst_root, directory), exist_ok=True)
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
    place = placers.get(chosen)
    if place is None:  # auto with no files at all
        return "empty"
    for rel in files:
        place(os.path.join(src_root, rel), os.path.join(dst_root, rel))
    return chosen
