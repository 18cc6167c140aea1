"""The pack format that backends share: many files' bytes back to back in one immutable
object named by the sha256 of its content, and index entries that give each file's pack,
offset, size and sha256.

Why packs, not one object per file (measured, docs/store.md): a scope is ~18,000 files; one
GET per file is ~18,000 requests per restore, and per-request cost, not bandwidth, dominates.
Packs of ~32 MiB make a 1 GiB restore ~32 parallel GETs.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PACK_BYTES = 32 * 1024 * 1024
# Unpacked files are created as manifest.make_read_only leaves a committed file (read-only,
# readable by all), so an unpack needs no chmod pass; exclusive: nothing is written through
# a file or link already there.
_FILE_MODE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def sha256_hex(data: bytes | memoryview) -> str:
    """The sha256 (hex) that names a pack or index object and checks each file."""
    return hashlib.sha256(data).hexdigest()


def chunks(upload: list[str], files: dict[str, Any]) -> Iterator[list[str]]:
    """`upload` (paths whose manifest entries in `files` give their sizes) grouped into packs
    of at most PACK_BYTES (a larger file is a pack of its own)."""
    chunk: list[str] = []
    size = 0
    for rel in upload:
        if chunk and size + files[rel]["size"] > PACK_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(rel)
        size += files[rel]["size"]
    if chunk:
        yield chunk


def build(
    scope: Path, rels: list[str], files: dict[str, Any]
) -> tuple[bytes, dict[str, dict[str, Any]]]:
    """One pack of files `rels` of `scope`, and each placed file's entry (sha256, size,
    offset; the caller adds the pack's name). A file that no longer matches its manifest
    entry in `files` is left out (never published)."""
    parts: list[bytes] = []
    placed: dict[str, dict[str, Any]] = {}
    offset = 0
    for rel in rels:
        data = (scope / rel).read_bytes()
        if sha256_hex(data) != files[rel]["sha256"]:
            continue
        placed[rel] = {"sha256": files[rel]["sha256"], "size": len(data), "offset": offset}
        parts.append(data)
        offset += len(data)
    return b"".join(parts), placed


def groups(entries: dict[str, dict[str, Any]]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Index entries by pack, each pack's files in offset order."""
    grouped: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for rel, e in entries.items():
        grouped.setdefault(e["pack"], []).append((rel, e))
    for files in grouped.values():
        files.sort(key=lambda item: item[1]["offset"])
    return grouped


def extract(
    pack: str,
    body: bytes,
    files: list[tuple[str, dict[str, Any]]],
    root: str,
    stats: dict[str, os.stat_result],
) -> list[str]:
    """Write pack `pack`'s `files` (its index entries) from its bytes `body` under `root`,
    each checked first; each written file's stat goes into `stats` (taken from the open
    file: no second pass). The files that did not match their entry, as problems."""
    view = memoryview(body)
    altered: list[str] = []
    for rel, e in files:
        data = view[e["offset"] : e["offset"] + e["size"]]
        if len(data) != e["size"] or sha256_hex(data) != e["sha256"]:
            altered.append(f"altered: {rel} (pack {pack[:12]})")
            continue
        path = os.path.join(root, rel)
        try:
            fd = os.open(path, _CREATE, _FILE_MODE)
        except FileNotFoundError:  # a directory the tree builder could not make
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, _CREATE, _FILE_MODE)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            st = os.fstat(fd)  # the size and mtime the manifest records (close keeps them)
            if stat.S_IMODE(st.st_mode) != _FILE_MODE:  # a umask took read bits
                os.fchmod(fd, _FILE_MODE)
        finally:
            os.close(fd)
        stats[rel] = st
    return altered
