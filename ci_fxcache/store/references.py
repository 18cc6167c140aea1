"""The recorded references of a combination, one per version of its workload: which a hot-only
run compares (the newest `MAX_COMPARED`), and which a save prunes (the rest).

A combination's cold phase records its reference in `verify/<combo id>/`; a later version of
the workload (an edited model) records its own in `verify/<combo id>/versions/<stamp>-<id>/`
beside the committed one (ci_fxcache/verify/versions.py). Only the newest `MAX_COMPARED` are
ever compared, so the older ones are dead weight, a full copy of the combination's caches
each: every merged edit (a comment too) would add one. The save drops them from the manifest
and the disk under the scope's lock, where committed files may be removed (by the store, never
by a job).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

REFERENCE = "reference.json"
REFERENCE_TENSORS = "reference.pt"
# Where several ranks keep their tensors: one directory a rank, rank 0's this one
# (verify/ranks.py `rank_dir`).
FIRST_RANK = "rank0"
VERSIONS = "versions"
VERIFY = "verify"
# The versions a run compares a workload with: each costs a read of its reference.json (and,
# when only the eager outputs differ, of its reference.pt). Older ones are pruned at save.
MAX_COMPARED = 8


def has_reference(directory: Path) -> bool:
    """Whether a cold phase recorded a reference in `directory`."""
    tensors = (directory / REFERENCE_TENSORS, directory / FIRST_RANK / REFERENCE_TENSORS)
    return (directory / REFERENCE).is_file() and any(t.is_file() for t in tensors)


def _created(directory: Path) -> str:
    try:
        return str(json.loads((directory / REFERENCE).read_text()).get("created_at") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def newest_first(base: Path) -> list[Path]:
    """Every directory holding a recorded reference of the combination whose directory is
    `base` (`base` itself and its versions), newest first."""
    found = [base] if has_reference(base) else []
    versions = base / VERSIONS
    if versions.is_dir():
        found += [d for d in versions.iterdir() if d.is_dir() and has_reference(d)]
    found.sort(key=lambda d: (_created(d), d.name), reverse=True)
    return found


def compared(base: Path) -> list[Path]:
    """The references a hot-only run compares the workload with: the newest `MAX_COMPARED`."""
    return newest_first(base)[:MAX_COMPARED]


def beyond_compared(scope: Path, listed: set[str]) -> list[str]:
    """The scope-relative prefixes of the references no run compares any more, among files the
    manifest lists (`listed`): a version's directory (`verify/<id>/versions/<v>/`), or the
    combination's own files outside `versions/` (`verify/<id>/`, the oldest) when it falls out."""
    verify = scope / VERIFY
    if not verify.is_dir():
        return []
    prefixes: list[str] = []
    for base in sorted(d for d in verify.iterdir() if d.is_dir() and not d.is_symlink()):
        for old in newest_first(base)[MAX_COMPARED:]:
            rel = old.relative_to(scope).as_posix()
            if f"{rel}/{REFERENCE}" in listed:  # committed, not a job's own
                prefixes.append(rel + "/")
    return prefixes


def pruned(rel: str, prefixes: list[str]) -> bool:
    """Whether the scope file `rel` lies under one of `prefixes` (`beyond_compared`); a base
    combination directory's `versions/` is never under its own prefix."""
    for prefix in prefixes:
        if rel.startswith(prefix) and not (
            prefix.count("/") == 2 and rel[len(prefix) :].startswith(VERSIONS + "/")
        ):
            return True
    return False


def remove(scope: Path, rels: list[str]) -> None:
    """Delete the pruned files (committed read-only, in directories a save closed to others),
    and the directories left empty."""
    parents: set[Path] = set()
    for rel in rels:
        path = scope / rel
        parents.add(path.parent)
        try:
            _owner_writable(path.parent)
            path.unlink()
        except FileNotFoundError:
            continue
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        while parent != scope and parent.is_dir() and not any(parent.iterdir()):
            _owner_writable(parent.parent)
            parent.rmdir()
            parent = parent.parent


def _owner_writable(directory: Path) -> None:
    mode = stat.S_IMODE(os.lstat(directory).st_mode)
    if not mode & stat.S_IWUSR:
        os.chmod(directory, mode | stat.S_IWUSR)
