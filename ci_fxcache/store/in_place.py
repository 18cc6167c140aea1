"""Files that torch or Triton open for writing in place inside the cache dirs: never committed.

The store's protection of committed files (mode 0444, hardlinked overlays) rests on torch and
Triton replacing cache entries by rename. A file they reopen for writing where it is breaks
that: made read-only, the next compile of a non-root job fails with EACCES; hardlinked into an
overlay, the write would reach the committed copy. Found by reading the sources of torch 2.13.0
and 2.14.1 (with its Triton 3.8) for every write into an existing path under
TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR:

- Lock files (`*.lock`), opened read-write by `filelock` on every acquisition: Inductor's
  `locks/<key>.lock` (codecache: C++ / CUDA / ROCm / AOT builds, cpu_vec_isa's ISA probe,
  `g++.lock`), `locks/<4 hex>.lock` (cache.py), `memoizer_cache.lock`, `dir.lock`
  (runtime/caching), `<file>.lock` beside PGO's code state (_dynamo/pgo.py), `<dir>.lock`
  (triton_bundler on Windows), `<name>.debug.lock` (debug.py). Their content is never read:
  the store ignores them (never listed, never checked, never placed in an overlay; torch
  creates a fresh one where it needs one), and `save` gives them the store's writable mode so
  that the other users of a group-shared store can open them.
- Files rewritten or appended to in place, whose content torch reads: `memoizer_cache.json`
  (rewritten with "w" at exit when the memoizer dump is enabled), PGO's fixed temporary
  `dynamo/code_state_*.pkl.tmp` (opened "wb" before its rename), AOTInductor's generated
  `*.wrapper.cpp` / `*.kernel.cpp` (appended to after every build) and the objects it rebuilds
  and patches in place (`*.o`, opened "r+b"), and a failed build's `<output>.error` (rewritten
  with "w"). They are never committed: `save` leaves them out of the manifest, and the next
  restore without a live writer sets them aside like any unsaved file.

Triton 3.8 writes every cache entry to a temporary name and renames it (runtime/cache.py), and
so do Inductor's `write_atomic` and its C++ builds of new outputs (`.so` files are built only
when missing, under the lock above).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

LOCK_SUFFIX = ".lock"
_REWRITTEN_NAMES = frozenset({"memoizer_cache.json"})
_REWRITTEN_SUFFIXES = (".pkl.tmp", ".wrapper.cpp", ".kernel.cpp", ".o", ".error")


def is_lock(name: str) -> bool:
    """A lock file (by its name or relative path): opened for writing by every compile."""
    return name.endswith(LOCK_SUFFIX)


def written_in_place(rel: str) -> bool:
    """True when torch or Triton may write the file at `rel` (a path in a cache dir) where it
    is: such a file is never committed, made read-only or shared into an overlay."""
    name = rel.rpartition("/")[2]
    return is_lock(name) or name in _REWRITTEN_NAMES or name.endswith(_REWRITTEN_SUFFIXES)


def committable(rels: Iterable[str]) -> list[str]:
    """The paths of `rels` that may be committed (not written in place), in their order."""
    return [rel for rel in rels if not written_in_place(rel)]


def make_writable(scope_dir: Path, rels: Iterable[str], mode: int) -> None:
    """Give the lock files among `rels` the writable `mode` (the store's, see store.modes), so
    that the next compile can open them: a lock made read-only by an older save, or created by
    torch without group write in a group-shared store. Best effort: a file of another owner
    stays as it is (its owner's save opens it up)."""
    for rel in rels:
        if not is_lock(rel):
            continue
        path = scope_dir / rel
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)
        except OSError:
            continue
