"""The store's file modes: the umask of whoever runs it, but never writable by others.

A store shared by several runner users in one group works with umask 002: directories 0775,
files 0664, committed files 0444. Whatever the umask (000 included), nothing the store creates
is world-writable: any local user could otherwise plant a cache entry or a lease.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

NEVER = 0o002  # write permission for others


def restrict_umask() -> int:
    """Add "others may not write" to the process umask (all the store's mkdirs and files, and
    its background spare builds, follow it); the umask now in force."""
    old = os.umask(0)
    mask = old | NEVER
    os.umask(mask)
    return mask


def current_umask() -> int:
    """The process umask (read by setting it back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode of a file the store writes (manifest, seal, a lock torch opens): 0666 less the
    umask, never world-writable."""
    return 0o666 & ~(current_umask() | NEVER)


def read_only_mode(mode: int) -> int:
    """The mode of a committed file that had `mode`: no write bit; readable by whoever the
    umask lets read (the group of a group-shared store), as torch creates some entries 0600."""
    return (mode | (0o444 & ~current_umask())) & 0o555


def close_directories(scope_dir: Path, rels: Iterable[str]) -> None:
    """Take others' write permission from the directories holding `rels` (paths of files a
    save commits) and their parents inside the scope: torch makes its directories under the
    job's umask, and a world-writable one would let any local user add files to the scope."""
    seen: set[str] = set()
    for rel in rels:
        parent = rel.rpartition("/")[0]
        while parent and parent not in seen:
            seen.add(parent)
            path = scope_dir / parent
            with suppress(OSError):
                mode = stat.S_IMODE(os.lstat(path).st_mode)
                if mode & NEVER:
                    os.chmod(path, mode & ~NEVER)
            parent = parent.rpartition("/")[0]
