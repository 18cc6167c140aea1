"""The GitHub cache tier's archive of one scope: the remote tiers' pack format
(store.remote.packs) as one stream, written by a save and read by a restore as it downloads.

    MAGIC | header length (4 bytes, little-endian) | header | frames

The header (zstd JSON, HEADER_SCHEMA) holds the scope's manifest as its save committed it
(its text, so a signature stays valid), where each listed file's bytes start in the decoded
stream (`offsets`), and the frame table. Only the files the manifest lists are archived: never
a lock file or a file a job wrote without saving it.

A restore reads the header, then the frames in order as they arrive: each run of frames that
holds whole files (a span) is decoded, hashed and written by one of usable_cpus() workers
while the next downloads. Each file is created once, checked against the manifest's sha256
as it is written, and given the manifest's mtime, so the local restore's fast check matches
it without reading it again; one file that does not match refuses the whole archive. Why not
tar any more: once zstd had replaced gzip, tarfile's work per member (a header parsed,
filtered and extracted in Python) was most of a restore (docs/store.md).

Memory: the header is refused above MAX_HEADER_STORED bytes as stored, and decoded to at most
MAX_HEADER_JSON; then at most usable_cpus() + 1 spans of less than 2 x SPAN_BYTES are in
memory at once (one per worker and the one being read; a span above that, a larger file, is
decoded frame by frame as it is read), plus one decoded frame (packs.FRAME_BYTES) per worker
and the reader's frame as stored and decoded: (CPUs + 1) x 8 MiB + (CPUs + 2) x 4 MiB, 40 MiB
on 2 CPUs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache.env.cpus import usable_cpus
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import modes
from ci_fxcache.store.layout import CACHE_DIRS, MANIFEST
from ci_fxcache.store.remote import packs
from ci_fxcache.store.seal import Fresh, Seal
from ci_fxcache.store.stat_batch import Dirs

MAGIC = b"FXSCOPE\x01"
HEADER_SCHEMA = "fxcache-github-archive/1"
_HEADER_FIELDS = frozenset({"schema", "manifest", "offsets", "frames"})
# The header takes ~100 bytes a file beside the manifest's ~150: 64 MiB is ~250,000 files
# (a scope is ~18,000); as stored (zstd) it is refused above 16 MiB before it is read.
MAX_HEADER_STORED = 16 * 1024 * 1024
MAX_HEADER_JSON = 64 * 1024 * 1024
SPAN_BYTES = 4 * 1024 * 1024
_PACK = "archive"  # the name problems give the archive's one pack
_HEADER_WINDOW = 1 << 23
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class ArchiveError(Exception):
    """An archive that is not one a save wrote, or whose bytes do not match its manifest."""


@dataclass(frozen=True)
class Unpacked:
    """What a restore wrote: files, bytes, and what it vouches for (store.seal.Fresh: the
    sha256 of the manifest it wrote, every directory and file it made, each file checked
    against the manifest as it was written)."""

    files: int
    total_bytes: int
    written: Fresh


def _add_committed(framer: packs.Framer, scope: Path, rel: str, meta: dict[str, Any]) -> None:
    """Append a committed file's bytes to `framer`, one frame at a time; ArchiveError when
    they are no longer what the manifest says (the archive would refuse itself at every
    restore: the caller discards what it wrote)."""
    try:
        fd = os.open(scope / rel, _READ_FLAGS)
        with os.fdopen(fd, "rb") as f:
            sha, added = framer.add_stream(f, meta["size"], packs.kind_of(rel))
    except OSError as exc:
        raise ArchiveError(f"{rel}: {exc.strerror or exc}") from None
    if added != meta["size"] or sha != meta["sha256"]:
        raise ArchiveError(f"{rel} changed since it was committed")


def write(scope: Path, archive: Path, committed: mf.Committed | None = None) -> int:
    """The archive of committed scope `scope` (manifest `committed`, as its save wrote it;
    None: the scope's manifest.json, for tools without a save) and every file it lists into
    `archive`; its size in bytes. ArchiveError when the scope is not as committed, or when
    its header would be larger than a restore reads (never uploaded). Memory: one frame read,
    decoded and stored at a time, plus the header (~250 bytes a file)."""
    import zstandard

    if committed is None:
        try:
            committed = mf.Committed.read(scope / MANIFEST)
        except mf.ManifestError as exc:
            raise ArchiveError(str(exc)) from None
    files: dict[str, dict[str, Any]] = committed.manifest["files"]
    offsets: dict[str, int] = {}
    with tempfile.TemporaryFile(dir=archive.parent) as frames:
        framer = packs.Framer(frames.write)
        for rel in packs.by_kind(files):
            if not mf.safe_relpath(rel):
                raise ArchiveError(f"manifest entry {rel[:200]!r} leaves the scope")
            offsets[rel] = framer.position
            _add_committed(framer, scope, rel, files[rel])
        framer.flush()
        header = {
            "schema": HEADER_SCHEMA,
            "manifest": committed.text,
            "offsets": offsets,
            "frames": [list(f) for f in framer.frames],
        }
        text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
        del header
        packed = zstandard.ZstdCompressor(level=packs.LEVEL).compress(text)
        if len(text) > MAX_HEADER_JSON or len(packed) > MAX_HEADER_STORED:
            raise ArchiveError(
                f"its header ({len(files):,} files: {len(text):,} bytes, {len(packed):,} "
                f"stored) is larger than a restore reads ({MAX_HEADER_JSON:,}, "
                f"{MAX_HEADER_STORED:,})"
            )
        del text
        with archive.open("wb") as out:
            out.write(MAGIC + len(packed).to_bytes(4, "little") + packed)
            frames.seek(0)
            shutil.copyfileobj(frames, out, 1 << 20)
    return archive.stat().st_size


def _inflate(stored: bytes) -> bytes:
    import zstandard

    try:
        return packs.inflate_bounded(stored, MAX_HEADER_JSON, _HEADER_WINDOW)
    except zstandard.ZstdError as exc:
        raise ArchiveError(f"header does not decode ({exc})") from None
    except packs.TooLarge:
        raise ArchiveError("header is larger than any save writes") from None


def _header(
    read: Callable[[int], bytes],
) -> tuple[bytes, dict[str, Any], list[packs.Frame], dict[str, int]]:
    """(manifest bytes, manifest, frame table, offsets) of the archive `read` starts."""
    start = read(len(MAGIC) + 4)
    if len(start) < len(MAGIC) + 4 or not start.startswith(MAGIC):
        raise ArchiveError("not an fxcache archive")
    length = int.from_bytes(start[len(MAGIC) :], "little")
    if length > MAX_HEADER_STORED:
        raise ArchiveError("header is larger than any save writes")
    stored = read(length)
    if len(stored) != length:
        raise ArchiveError("the archive ends in its header")
    try:
        header = json.loads(_inflate(stored).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ArchiveError("header is not JSON") from None
    if not (
        isinstance(header, dict)
        and set(header) == _HEADER_FIELDS
        and header["schema"] == HEADER_SCHEMA
        and isinstance(header["manifest"], str)
    ):
        raise ArchiveError("header is not one a save writes")
    problem = packs.frames_problem(header["frames"])
    if problem:
        raise ArchiveError(problem)
    table = [packs.Frame(*f) for f in header["frames"]]
    try:
        raw = header["manifest"].encode("utf-8")
        manifest = mf.parse(raw)
    except (UnicodeEncodeError, mf.ManifestError) as exc:
        raise ArchiveError(f"its manifest: {exc}") from None
    offsets = header["offsets"]
    files: dict[str, dict[str, Any]] = manifest["files"]
    extent = packs.decoded_size(table)
    if not (isinstance(offsets, dict) and set(offsets) == set(files)):
        raise ArchiveError("header does not place every file its manifest lists")
    for rel, at in offsets.items():
        if not (mf.safe_relpath(rel) and mf.is_count(at) and at + files[rel]["size"] <= extent):
            raise ArchiveError(f"header entry {rel[:200]!r} is malformed")
    return raw, manifest, table, offsets


def extract(read: Callable[[int], bytes], target: Path) -> Unpacked:
    """Write the archive that `read(n)` streams (exactly n bytes, fewer only where it ends)
    into `target`, a fresh directory it creates, as it arrives. ArchiveError when the
    archive is not one a save wrote or any file does not match its manifest (what was
    written is left for the caller to remove)."""
    raw, manifest, table, offsets = _header(read)
    files: dict[str, dict[str, Any]] = manifest["files"]
    entries = {
        rel: packs.Entry(meta["sha256"], meta["size"], offsets[rel], _PACK, table,
                         meta.get("mtime_ns"))
        for rel, meta in files.items()
    }  # fmt: skip
    target.mkdir()
    tree = packs.Tree(str(target))
    stats: dict[str, os.stat_result] = {}
    problems = packs.write_empty(entries, tree, stats)
    problems += _frames(read, entries, tree, stats)
    if problems:
        raise ArchiveError(f"{len(problems)} file(s) do not match its manifest; first: "
                           f"{sorted(problems)[0]}")  # fmt: skip
    fd = os.open(target / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                 modes.file_mode())  # fmt: skip
    with os.fdopen(fd, "wb") as out:
        out.write(raw)
    for name in CACHE_DIRS:  # as the local restore makes them: the seal covers every one
        tree.make(name)
    made = Seal(Dirs.of(tree.stamps()), mf.listed(manifest), bool(manifest.get("signature")))
    digest = hashlib.sha256(raw).hexdigest()
    return Unpacked(len(files), manifest["total_bytes"], packs.written(digest, made, stats))


def _frames(
    read: Callable[[int], bytes],
    entries: packs.Index,
    tree: packs.Tree,
    stats: dict[str, os.stat_result],
) -> list[str]:
    """Every span of the frame stream, in stream order: a small one read whole and handed to
    a worker, a large one (a big file) decoded here frame by frame as it is read."""
    workers = usable_cpus()
    held = threading.BoundedSemaphore(workers + 1)  # spans in memory: one per worker, one read
    local = threading.local()

    def unpack(span: packs.Span, body: bytes) -> list[str]:
        try:
            if not hasattr(local, "decoder"):
                local.decoder = packs.Decoder()
            return packs.unpack_span(span, _Slices(body).read, tree, stats, local.decoder)
        finally:
            held.release()

    at = 0
    problems: list[str] = []
    running: list[Future[list[str]]] = []
    inline = packs.Decoder()
    with ThreadPoolExecutor(workers) as pool:
        try:
            for span in sorted(packs.spans(entries, SPAN_BYTES), key=lambda s: s.start):
                if span.start > at:  # bytes no listed file needs: a save writes none
                    read(span.start - at)
                if span.end - span.start > 2 * SPAN_BYTES:
                    problems += packs.unpack_span(span, read, tree, stats, inline)
                else:
                    held.acquire()
                    try:
                        body = read(span.end - span.start)
                    except BaseException:
                        held.release()
                        raise
                    running.append(pool.submit(unpack, span, body))
                at = span.end
        finally:
            for future in running:  # every worker done before anything is removed
                with contextlib.suppress(BaseException):
                    future.result()
    for future in running:
        problems += future.result()
    return problems


class _Slices:
    """`read(n)` over bytes in memory without copying them (a view of each frame)."""

    def __init__(self, body: bytes) -> None:
        self._view = memoryview(body)
        self._at = 0

    def read(self, n: int) -> memoryview:
        piece = self._view[self._at : self._at + n]
        self._at += len(piece)
        return piece
