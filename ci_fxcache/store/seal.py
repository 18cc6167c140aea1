"""Seals: which directories of a scope are unchanged since a clean integrity check listed them.

Listing every directory is most of a restore's integrity check (Inductor puts nearly every
entry in a directory of its own). A directory's ctime changes whenever an entry is added,
removed or renamed in it, and no unprivileged process can set it back (`utime` sets mtime and
atime, and itself changes ctime). So a directory whose inode and ctime are what they were when
a check listed it and found nothing wrong holds the same entries: the check stats it instead of
listing it. Every file is still stat'ed against the manifest; a full verification ignores seals.

A seal also carries the manifest's file list with each file's size and mtime (`Listed`), and
whether the manifest is signed: a fast check that finds every directory and every file as sealed
then needs nothing from the manifest, and skips parsing it (the manifest is most of what a
restore reads). Anything that differs sends the check back to the manifest, which says what.

A seal belongs to one manifest (its sha256) and one scope directory (device and inode): after a
save, a quarantine or a copy to another host it no longer applies and the next check lists
everything again. A directory is sealed only when its ctime is older than `MARGIN_NS` before
the check began: ctime has a coarse clock (a tick; a second on some filesystems), and a change
in the same tick as the recorded ctime would otherwise go unseen.

What a seal does not cover: root can set the clock back, and whoever can write the store can
rewrite a seal as they can rewrite an unsigned manifest. Seals are an accelerator of the fast
check, never a substitute for a signed manifest's full verification.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import atomic_write
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import modes
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.stat_batch import NO_DIRS, Dirs, DirStamp

SCHEMA = "fxcache-seal/2"
MARGIN_NS = 2_000_000_000


@dataclass(frozen=True)
class Seal:
    """A scope's seal: its sealed directories, and the manifest's `Listed` (every file, size and
    mtime) and whether it is signed, so a fast check that finds nothing wrong need not parse the
    manifest (None: unknown, the manifest is parsed)."""

    dirs: Dirs = NO_DIRS
    listed: mf.Listed | None = None
    signed: bool = False


NONE = Seal()


@dataclass(frozen=True)
class Fresh:
    """What a fetch of this process wrote moments ago, each file's bytes checked against the
    remote index as they were written: the sha256 of the manifest it wrote, its seal, and
    each listed file's inode and ctime as written (in the manifest's order). Never stored:
    only the process that checked the bytes can vouch for them.

    A full verification right after that fetch (a signing key's) stats the files instead of
    hashing them again (`unchanged`): a file whose inode and ctime are as written has not been
    written, truncated, replaced or had its mtime set since (no unprivileged process can set
    a ctime back), and a directory's unchanged inode and ctime mean no entry was added or
    removed. What it does not cover: a change in the same clock tick (a few ms) as the fetch
    wrote the file, which only a process racing the fetch on purpose can make, and which such
    a process can as well make right after any check (docs/store.md: a file changed after
    restore checked it); root setting the clock back."""

    manifest_sha256: str
    sealed: Seal
    inodes: list[int]
    ctimes: list[int]

    def unchanged(self, scope: Path, manifest_sha256: str, manifest: Mapping[str, Any]) -> bool:
        """Whether `scope`, whose manifest has `manifest_sha256` and parses to `manifest`, is
        still exactly what the fetch wrote."""
        listed = self.sealed.listed
        return (
            listed is not None
            and manifest_sha256 == self.manifest_sha256
            and list(manifest["files"]) == listed.names
            and mf.unchanged_since_written(
                scope, self.sealed.dirs, listed.names, self.inodes, self.ctimes
            )
        )


def _scope_id(scope: Path) -> list[int] | None:
    try:
        st = os.lstat(scope)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _columns(data: dict[str, Any], names: tuple[str, str, str]) -> list[list[Any]] | None:
    """Three equally long lists: strings, then two of integers; None when they are not."""
    columns = [data.get(name) for name in names]
    lists = [column for column in columns if isinstance(column, list)]
    if not (
        len(lists) == 3
        and len(lists[0]) == len(lists[1]) == len(lists[2])
        and set(map(type, lists[0])) <= {str}
        and set(map(type, lists[1])) | set(map(type, lists[2])) <= {int}
    ):
        return None
    try:  # a name Python cannot hand to the OS (a lone surrogate) is not one we wrote
        "".join(lists[0]).encode("utf-8")
    except UnicodeEncodeError:
        return None
    return lists


def load(layout: Layout, key: str, manifest_sha256: str) -> Seal:
    """The seal of scope `key` for this manifest; `NONE` when there is no seal, it belongs to
    another manifest or scope directory, or it is malformed in any way."""
    try:
        data = json.loads(layout.seal(key).read_bytes())
    except (OSError, ValueError, RecursionError):
        return NONE
    if not (
        isinstance(data, dict)
        and data.get("schema") == SCHEMA
        and data.get("manifest_sha256") == manifest_sha256
        and data.get("scope") == _scope_id(layout.scope(key))
        and isinstance(data.get("signed"), bool)
    ):
        return NONE
    dirs = _columns(data, ("dirs", "inodes", "ctimes"))
    files = _columns(data, ("files", "sizes", "mtimes"))
    if dirs is None or files is None:
        return NONE
    return Seal(Dirs(*dirs), mf.Listed(*files), data["signed"])


def refresh(
    layout: Layout,
    key: str,
    manifest_sha256: str,
    stamps: Mapping[str, DirStamp],
    started_ns: int,
    previous: Seal,
    listed: mf.Listed,
    signed: bool,
    exclude: Collection[str] = (),
) -> None:
    """Seal the directories of a clean check (`stamps`, taken by a check that began at
    `started_ns`) whose ctime is safely older than that start, but not those in `exclude`
    (they hold files the manifest does not list), with the manifest's `listed` files and
    whether it is `signed`; nothing is written when that is the seal there is (`previous`)."""
    limit = started_ns - MARGIN_NS
    dirs = {rel: st for rel, st in stamps.items() if st[1] < limit and rel not in exclude}
    # A directory that is not sealed is found only by listing its parent: so no ancestor of
    # one may be sealed either.
    for rel in [rel for rel in stamps if rel not in dirs] + list(exclude):
        while "/" in rel:
            rel = rel.rpartition("/")[0]
            if dirs.pop(rel, None) is None:
                break  # already unsealed, and so are its ancestors (or they will be)
    sealed = Seal(Dirs.of(dirs), listed, signed)
    if sealed != previous:
        write(layout, key, manifest_sha256, sealed)


def write(layout: Layout, key: str, manifest_sha256: str, sealed: Seal) -> None:
    """Record `sealed` for this manifest (best effort: a seal is only an accelerator)."""
    scope_id = _scope_id(layout.scope(key))
    if scope_id is None or sealed.listed is None:
        return
    body: dict[str, Any] = {
        "schema": SCHEMA,
        "manifest_sha256": manifest_sha256,
        "scope": scope_id,
        # Flat lists: a fifth of the parsing time of one object per directory or file.
        "dirs": sealed.dirs.names,
        "inodes": sealed.dirs.inodes,
        "ctimes": sealed.dirs.ctimes,
        "files": sealed.listed.names,
        "sizes": sealed.listed.sizes,
        "mtimes": sealed.listed.mtimes,
        "signed": sealed.signed,
    }
    path = layout.seal(key)
    with suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(body, separators=(",", ":"))
        atomic_write.write_text(path, text, path.parent, mode=modes.file_mode())


def drop(layout: Layout, key: str) -> None:
    """Forget the seal of `key` (its scope was moved or removed)."""
    with suppress(OSError):
        layout.seal(key).unlink()


def prune_orphans(layout: Layout) -> int:
    """Remove the seals of scopes that no longer exist (removed by hand); how many."""
    if not layout.seals.is_dir():
        return 0
    count = 0
    for path in layout.seals.glob("*.json"):
        if not layout.scope(path.name.removesuffix(".json")).is_dir():
            with suppress(OSError):
                path.unlink()
                count += 1
    return count
