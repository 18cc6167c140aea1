"""The pack format that backends share: many files' bytes back to back in one immutable
object named by the sha256 of its stored bytes, as a run of independently decodable frames,
and index entries that give each file's pack, offset, size and sha256.

Why packs, not one object per file (measured, docs/store.md): a scope is ~18,000 files; one
GET per file is ~18,000 requests per restore, and per-request cost, not bandwidth, dominates.
Packs of ~32 MiB make a 1 GiB restore ~32 objects.

A pack's decoded stream is its files back to back (an entry's `offset` is into that stream).
It is stored as frames of at most FRAME_BYTES of the stream each: a zstd frame (level LEVEL,
content size in its header), or the bytes as they are when zstd would save less than 1/32
(`.so` files, random data). A frame holds a run of whole files, or a piece of a file larger
than a frame. The frame table (decoded size, stored size, codec of each frame) travels in the
index, so a reader knows where each byte is before it asks: it GETs a byte range of whole
frames, decodes one frame at a time (memory: one frame stored + one decoded per reader), and
hashes each file before it is complete on disk; or, where the pack is named by the sha256 of
its stored bytes and the range holds all of them, hashes those instead (a fifth as many
bytes for Inductor's files), and each file only if they do not match (unpack_span). Files
are ordered by kind (name suffix, then folder) before they are packed: Inductor's `.so`,
`.cpp` and graph entries resemble their own kind, and a 4 MiB frame then compresses about as
well as one zstd stream over a tar (measured, docs/store.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from ci_fxcache.store import manifest as mf
from ci_fxcache.store.seal import Fresh, Seal
from ci_fxcache.store.stat_batch import DirStamp, dir_stamp

PACK_BYTES = 32 * 1024 * 1024  # decoded bytes per pack (a larger file is a pack of its own)
# Files per pack at most: a runner's record of a pack it uploaded (a one-pack segment) stays
# within what a segment reader accepts (s3/index.py) however small the files.
PACK_FILES = 50_000
FRAME_BYTES = 4 * 1024 * 1024  # decoded bytes per frame at most: also the zstd window
# zstd level, by measurement (docs/store.md): 6 stores 6 % fewer bytes than 3 for 1.8x the
# save's CPU (9: 8 % for 3x); every restore reads what one save wrote.
LEVEL = 6
RAW, ZSTD = "raw", "zstd"
CODECS = (RAW, ZSTD)
_WINDOW_LOG = FRAME_BYTES.bit_length() - 1
# Unpacked files are created as manifest.make_read_only leaves a committed file (read-only,
# readable by all), so an unpack needs no chmod pass; exclusive: nothing is written through
# a file or link already there.
_FILE_MODE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Frame(NamedTuple):
    """One frame of a pack: its decoded and stored sizes, and how it is stored."""

    size: int
    stored: int
    codec: str


class Entry(NamedTuple):
    """One file of an index: its sha256 and size, where its bytes start in its pack's decoded
    stream, the pack's name, and the pack's frame table (one list shared by the pack's
    entries); `mtime_ns` as a manifest records it, where the entry comes from one (the GitHub
    tier's archive; restored files then keep it, so the fast check matches).

    A NamedTuple, not a frozen dataclass: a 1M-file index is decoded into 1M of them, and a
    frozen slotted dataclass takes 1.6x as long to build (docs/store.md)."""

    sha256: str
    size: int
    offset: int
    pack: str
    frames: list[Frame]
    mtime_ns: int | None = None


Index = dict[str, Entry]  # path -> entry


class FrameError(Exception):
    """A frame whose bytes do not decode to what the frame table says."""


class TooLarge(Exception):
    """Bytes that would decode to more than their reader accepts."""


def inflate_bounded(stored: bytes, limit: int, window: int) -> bytes:
    """The zstd frame `stored` decoded, reading at most `limit` bytes of it with a window of
    at most `window` (a small object: a header, a segment); zstandard.ZstdError when it does
    not decode, TooLarge when it would decode to more than `limit`."""
    import zstandard

    dctx = zstandard.ZstdDecompressor(max_window_size=window)
    pieces: list[bytes] = []
    total = 0
    with dctx.stream_reader(io.BytesIO(stored), read_across_frames=False) as reader:
        while total <= limit and (piece := reader.read(1 << 20)):
            pieces.append(piece)
            total += len(piece)
    if total > limit:
        raise TooLarge(f"decodes to more than {limit} bytes")
    return b"".join(pieces)


def sha256_hex(data: bytes | memoryview) -> str:
    """The sha256 (hex) that names a pack or index object and checks each file."""
    return hashlib.sha256(data).hexdigest()


def frames_problem(frames: object) -> str | None:
    """Why a frame table read from an index is not one a writer makes, or None."""
    if not isinstance(frames, list):
        return "frame table is not a list of frames"
    for f in frames:
        if not (
            isinstance(f, (list, tuple))
            and len(f) == 3
            and all(type(n) is int for n in f[:2])
            and 0 < f[0] <= FRAME_BYTES
            and 0 < f[1] <= FRAME_BYTES
            and f[2] in CODECS
            and (f[2] != RAW or f[0] == f[1])
        ):
            return "frame table holds a malformed frame"
    return None


def decoded_size(frames: Iterable[Frame]) -> int:
    """Bytes of the decoded stream that `frames` hold."""
    return sum(f.size for f in frames)


def raw_frames(length: int) -> list[Frame]:
    """The table of `length` bytes stored as they are (packs of the first format, which
    had no frames: any split of raw bytes is a valid table)."""
    return [
        Frame(min(FRAME_BYTES, length - at), min(FRAME_BYTES, length - at), RAW)
        for at in range(0, length, FRAME_BYTES)
    ]


def _kind(rel: str) -> tuple[str, str, str]:
    folder, _, name = rel.rpartition("/")
    return name.partition(".")[2], folder.partition("/")[2].partition("/")[0], rel


def kind_of(rel: str) -> str:
    """What a frame holds one of: the file's name suffix (`so`, `py`, `cubin`, ...)."""
    return _kind(rel)[0]


def by_kind(rels: Iterable[str]) -> list[str]:
    """`rels` in the order files are packed: by kind (name suffix, then folder)."""
    return sorted(rels, key=_kind)


def chunks(upload: list[str], files: dict[str, Any]) -> Iterator[list[str]]:
    """`upload` (paths whose manifest entries in `files` give their sizes), ordered by kind,
    grouped into packs of at most PACK_BYTES and PACK_FILES (a larger file is a pack of its
    own)."""
    chunk: list[str] = []
    size = 0
    for rel in by_kind(upload):
        if chunk and (size + files[rel]["size"] > PACK_BYTES or len(chunk) >= PACK_FILES):
            yield chunk
            chunk, size = [], 0
        chunk.append(rel)
        size += files[rel]["size"]
    if chunk:
        yield chunk


class Framer:
    """Cuts a stream of files into frames and compresses each (a file that fits in a frame
    is never cut; a larger one is cut into whole frames). Each stored frame goes to `sink`
    as it is made, else into `parts`. `position`: decoded bytes added so far."""

    def __init__(self, sink: Callable[[bytes], object] | None = None) -> None:
        import zstandard

        params = zstandard.ZstdCompressionParameters.from_level(LEVEL, window_log=_WINDOW_LOG)
        self._cctx = zstandard.ZstdCompressor(compression_params=params)
        self._sink = sink
        self.parts: list[bytes] = []
        self.frames: list[Frame] = []
        self.position = 0
        self._pending: list[bytes | memoryview] = []
        self._size = 0
        self._kind = ""

    def add(self, data: bytes, kind: str) -> None:
        """Append one file of `kind` (a frame holds one kind: one that does not compress
        is then stored as it is, whatever its neighbours)."""
        view = memoryview(data)
        self._start(len(view), kind)
        while len(view) > FRAME_BYTES:
            self._full(view[:FRAME_BYTES])
            view = view[FRAME_BYTES:]
        self._append(view)

    def add_stream(self, f: BinaryIO, size: int, kind: str) -> tuple[str, int]:
        """Append the file open as `f`, expected to hold `size` bytes, reading one frame at a
        time (the frames `add` would make of the same bytes): its sha256 and the bytes
        added. A file that changed since (another length, other bytes) is the caller's to
        leave out of the index: its bytes stay in the stream, named by no entry."""
        self._start(size, kind)
        digest = hashlib.sha256()
        added = 0
        while added < size:
            piece = f.read(min(FRAME_BYTES, size - added))
            if not piece:
                break
            digest.update(piece)
            added += len(piece)
            if len(piece) == FRAME_BYTES and added < size:
                self._full(memoryview(piece))
            else:
                self._append(memoryview(piece))
        if f.read(1):  # it grew: not the committed file
            digest.update(b"\0")
        return digest.hexdigest(), added

    def _start(self, size: int, kind: str) -> None:
        if self._size and (self._size + size > FRAME_BYTES or kind != self._kind):
            self.flush()
        self._kind = kind

    def _full(self, piece: memoryview) -> None:
        self._pending.append(piece)
        self._size = FRAME_BYTES
        self.position += len(piece)
        self.flush()

    def _append(self, piece: memoryview) -> None:
        if piece:
            self._pending.append(piece)
            self._size += len(piece)
            self.position += len(piece)

    def flush(self) -> None:
        """Close the frame being filled."""
        if not self._size:
            return
        raw = b"".join(self._pending)
        self._pending, self._size = [], 0
        packed = self._cctx.compress(raw)
        if len(packed) < len(raw) - len(raw) // 32:
            stored, frame = packed, Frame(len(raw), len(packed), ZSTD)
        else:  # does not compress: stored as it is
            stored, frame = raw, Frame(len(raw), len(raw), RAW)
        del raw, packed
        self.frames.append(frame)
        if self._sink is None:
            self.parts.append(stored)
        else:
            self._sink(stored)


def build(scope: Path, rels: list[str], files: dict[str, Any]) -> tuple[bytes, Index]:
    """One pack of files `rels` of `scope` in memory (build_into's, for small packs and the
    tests): its bytes and each placed file's entry."""
    out = io.BytesIO()
    _name, placed = build_into(scope, rels, files, out)
    return out.getvalue(), placed


def build_into(
    scope: Path, rels: list[str], files: dict[str, Any], out: BinaryIO
) -> tuple[str, Index]:
    """One pack of files `rels` of `scope`, written to `out` frame by frame as it is made:
    its name (the sha256 of its stored bytes) and each placed file's entry. Memory: one frame read,
    one decoded and one stored at a time, whatever the files' sizes. A file that no longer matches
    its manifest entry in `files` is left out (never published)."""
    digest = hashlib.sha256()

    def sink(stored: bytes) -> None:
        digest.update(stored)
        out.write(stored)

    framer = Framer(sink)
    placed: list[tuple[str, str, int, int]] = []  # path, sha256, size, offset
    for rel in rels:
        meta = files[rel]
        offset = framer.position
        try:
            with open(scope / rel, "rb") as f:
                if meta["size"] <= FRAME_BYTES:  # checked before it is added
                    data = f.read(meta["size"] + 1)
                    if sha256_hex(data) != meta["sha256"]:
                        continue
                    framer.add(data, kind_of(rel))
                    del data
                else:
                    sha, _added = framer.add_stream(f, meta["size"], kind_of(rel))
                    if sha != meta["sha256"]:
                        continue
        except OSError:  # gone since it was committed
            continue
        placed.append((rel, meta["sha256"], meta["size"], offset))
    framer.flush()
    name = digest.hexdigest()
    return name, {rel: Entry(sha, size, at, name, framer.frames) for rel, sha, size, at in placed}


class Decoder:
    """Decodes one frame at a time (one per thread: zstd contexts are not shared)."""

    def __init__(self) -> None:
        import zstandard

        self._zstd = zstandard
        self._dctx = zstandard.ZstdDecompressor(max_window_size=FRAME_BYTES)

    def decode(
        self, frame: Frame, stored: bytes | memoryview, out: bytearray | None = None
    ) -> bytes | memoryview:
        """The decoded bytes of `frame` from its `stored` bytes (into `out`, of at least
        FRAME_BYTES, when given: valid until `out` is used again); FrameError unless they are
        exactly `frame.size` bytes (a frame never decodes to more: its header's content size
        is checked first, so a bomb allocates nothing, and no more than `frame.size` bytes
        are ever decoded into `out`)."""
        if len(stored) != frame.stored:
            raise FrameError("the pack ends early")
        if frame.codec == RAW:
            return stored
        try:
            if self._zstd.frame_content_size(stored) != frame.size:
                raise FrameError("a frame's header disagrees with the frame table")
            data = self._dctx.decompress(stored) if out is None else self._into(frame, stored, out)
        except self._zstd.ZstdError as exc:
            raise FrameError(f"a frame does not decode ({exc})") from None
        if len(data) != frame.size:
            raise FrameError("a frame decodes to another size than the frame table says")
        return data

    def _into(self, frame: Frame, stored: bytes | memoryview, out: bytearray) -> memoryview:
        view = memoryview(out)[: frame.size]
        got = 0
        with self._dctx.stream_reader(stored, read_across_frames=False) as reader:
            while got < frame.size and (n := reader.readinto(view[got:])):
                got += n
            if got == frame.size and reader.read(1):
                raise FrameError("a frame decodes to another size than the frame table says")
        return view[:got]


@dataclass(frozen=True)
class Span:
    """A run of consecutive frames of one pack, read with one ranged GET: stored bytes
    `start` to `end` (exclusive), the decoded stream from `offset`, and the files in it."""

    pack: str
    start: int
    end: int
    offset: int
    frames: tuple[Frame, ...]
    files: tuple[tuple[str, Entry], ...]
    whole: bool = False  # its frames are the pack's whole frame table: every stored byte


def spans(entries: Index, range_bytes: int) -> list[Span]:
    """The ranged reads that fetch every non-empty entry: per pack, runs of the frames that hold
    wanted bytes, cut into spans of about `range_bytes` stored bytes, never inside a file (one
    reader writes each file). Largest first, so the slowest reads start early. Empty files:
    `write_empty`."""
    by_pack: dict[str, list[tuple[str, Entry]]] = {}
    for rel, e in entries.items():
        if e.size:
            by_pack.setdefault(e.pack, []).append((rel, e))
    found: list[Span] = []
    for pack, files in sorted(by_pack.items()):
        files.sort(key=lambda item: (item[1].offset, item[0]))
        # The entries of one pack share its frame table (decode_segment makes one per pack):
        # each distinct table is measured once, not once per file.
        tables = {id(e.frames): e.frames for _rel, e in files}
        table = max(tables.values(), key=decoded_size)
        found += _pack_spans(pack, table, files, range_bytes)
    found.sort(key=lambda s: s.end - s.start, reverse=True)
    return found


def _pack_spans(
    pack: str, table: list[Frame], files: list[tuple[str, Entry]], range_bytes: int
) -> list[Span]:
    starts, stored_at, at, st = [], [], 0, 0
    for f in table:
        starts.append(at)
        stored_at.append(st)
        at, st = at + f.size, st + f.stored
    # Per frame: is it wanted, and does a wanted file continue into the next one?
    wanted = [False] * len(table)
    joined = [False] * len(table)
    index = 0
    for _rel, e in files:
        first_byte, last_byte = e.offset, e.offset + e.size - 1
        while index + 1 < len(table) and starts[index + 1] <= first_byte:
            index += 1
        last = index
        while last + 1 < len(table) and starts[last + 1] <= last_byte:
            last += 1
        for k in range(index, last + 1):
            wanted[k] = True
            joined[k] = k < last or joined[k]
    found: list[Span] = []
    run: list[int] = []

    def close() -> None:
        if not run:
            return
        lo, hi = starts[run[0]], starts[run[-1]] + table[run[-1]].size
        inside = tuple((r, e) for r, e in files if lo <= e.offset < hi)
        end = stored_at[run[-1]] + table[run[-1]].stored
        frames = tuple(table[k] for k in run)
        whole = run[0] == 0 and run[-1] == len(table) - 1
        found.append(Span(pack, stored_at[run[0]], end, lo, frames, inside, whole))
        run.clear()

    total = stored_at[-1] + table[-1].stored if table else 0
    for k in range(len(table)):
        if not wanted[k]:
            close()
            continue
        run.append(k)
        done = stored_at[k] + table[k].stored
        # Never a tail of less than half a range after the cut: one request fewer, and a
        # pack a little over a range is read whole (so checked by its name: unpack_span).
        full = done - stored_at[run[0]] >= range_bytes
        if full and not joined[k] and total - done >= range_bytes // 2:
            close()
    close()
    return found


class Tree:
    """A fresh directory that unpacked files go into: each file created once (read-only,
    exclusive: nothing is written through a file or link already there), its directories made
    on first need, one mkdir each, by whichever thread needs them first. So directories are
    made while other ranges download, not all before the first one starts."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._made: set[str] = {""}

    def create(self, rel: str) -> int:
        """An fd of the new file `rel` (a safe relative path: the index checks them)."""
        parent = rel.rpartition("/")[0]
        if parent not in self._made:
            self.make(parent)
        return os.open(os.path.join(self.root, rel), _CREATE, _FILE_MODE)

    def make(self, rel: str) -> None:
        """Directory `rel` and those above it, unless made already."""
        up = rel.rpartition("/")[0]
        if up not in self._made:
            self.make(up)
        with contextlib.suppress(FileExistsError):  # another thread made it first
            os.mkdir(os.path.join(self.root, rel))
        self._made.add(rel)

    def stamps(self) -> dict[str, DirStamp]:
        """Each directory made (relative path) with its inode and ctime now (store.seal)."""
        return {
            rel: dir_stamp(os.lstat(os.path.join(self.root, rel)))
            for rel in sorted(self._made)
            if rel
        }


class Unpacker:
    """Writes the files of one span into `tree` from its decoded stream, fed in order:
    each file is hashed before it is complete and removed if it does not match its entry
    (with `check` false, the caller checks the span's stored bytes instead and calls
    `recheck` unless they match); each written file's stat goes into `stats` (taken from
    the open file: no second pass)."""

    def __init__(
        self,
        span: Span,
        tree: Tree,
        stats: dict[str, os.stat_result],
        problems: list[str],
        check: bool = True,
    ) -> None:
        self.span = span
        self.tree = tree
        self.stats = stats
        self.problems = problems
        self.check = check
        self.written: list[tuple[str, Entry]] = []  # unchecked, when not `check`
        self._todo = list(span.files)
        self._next = 0
        self._open: list[_Partial] = []

    def feed(self, offset: int, data: bytes | memoryview) -> None:
        """Bytes `offset` .. `offset + len(data)` of the pack's decoded stream."""
        end = offset + len(data)
        view = memoryview(data)
        while self._next < len(self._todo):
            rel, e = self._todo[self._next]
            if e.offset >= end:
                break
            self._next += 1
            lo = e.offset - offset
            if e.offset + e.size <= end:  # whole in this piece: check, then write once
                self._whole(rel, e, view[lo : lo + e.size])
            else:
                self._open.append(_Partial.start(self, rel, e))
        for part in list(self._open):
            lo = max(part.entry.offset, offset) - offset
            hi = min(part.entry.offset + part.entry.size, end) - offset
            if hi > lo and not part.write(view[lo:hi]):
                self._open.remove(part)

    def finish(self) -> None:
        """Files that the stream did not complete are problems (the pack ended early)."""
        for part in self._open:
            part.fail("truncated")
        for rel, _e in self._todo[self._next :]:
            self.problems.append(f"truncated: {rel} (pack {self.span.pack[:12]})")
        self._open.clear()
        self._next = len(self._todo)

    def abandon(self) -> None:
        """Close what is open (the read failed: the whole fetch is discarded)."""
        for part in self._open:
            os.close(part.fd)
        self._open.clear()

    def recheck(self) -> None:
        """Hash every file written unchecked, read back from disk, and remove each that does
        not match its entry (the span's stored bytes did not match its pack's name)."""
        for rel, e in self.written:
            path = Path(self.tree.root, rel)
            if mf.sha256_file(path) != e.sha256:
                path.unlink()
                self.stats.pop(rel, None)
                self.altered(rel)
        self.written.clear()

    def altered(self, rel: str) -> None:
        self.problems.append(f"altered: {rel} (pack {self.span.pack[:12]})")

    def create(self, rel: str) -> int:
        return self.tree.create(rel)

    def done(self, rel: str, entry: Entry, fd: int) -> None:
        """File `rel` is written: the mtime its entry gives (if any), its stat recorded."""
        if entry.mtime_ns is not None:  # as its manifest records it: the fast check matches
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        st = os.fstat(fd)  # the size and mtime the manifest records (close keeps them)
        if stat.S_IMODE(st.st_mode) != _FILE_MODE:  # a umask took read bits
            os.fchmod(fd, _FILE_MODE)
            st = os.fstat(fd)  # its ctime as left (store.seal.Fresh)
        self.stats[rel] = st

    def _whole(self, rel: str, e: Entry, data: memoryview) -> None:
        if self.check and sha256_hex(data) != e.sha256:
            self.altered(rel)
            return
        fd = self.create(rel)
        try:
            _write_all(fd, data)
            self.done(rel, e, fd)
        finally:
            os.close(fd)
        if not self.check:
            self.written.append((rel, e))


class _Partial:
    """A file that spans pieces of the stream: open, hashed as it is written."""

    def __init__(self, owner: Unpacker, rel: str, entry: Entry, fd: int) -> None:
        self.owner, self.rel, self.entry, self.fd = owner, rel, entry, fd
        self.hash = hashlib.sha256() if owner.check else None
        self.written = 0

    @classmethod
    def start(cls, owner: Unpacker, rel: str, entry: Entry) -> _Partial:
        return cls(owner, rel, entry, owner.create(rel))

    def write(self, data: memoryview) -> bool:
        """Write the next piece; False once the file is complete (or failed)."""
        if self.hash is not None:
            self.hash.update(data)
        _write_all(self.fd, data)
        self.written += len(data)
        if self.written < self.entry.size:
            return True
        if self.hash is not None and self.hash.hexdigest() != self.entry.sha256:
            self.fail("altered")
            return False
        try:
            self.owner.done(self.rel, self.entry, self.fd)
        finally:
            os.close(self.fd)
        if self.hash is None:
            self.owner.written.append((self.rel, self.entry))
        return False

    def fail(self, why: str) -> None:
        os.close(self.fd)
        os.unlink(os.path.join(self.owner.tree.root, self.rel))
        self.owner.problems.append(f"{why}: {self.rel} (pack {self.owner.span.pack[:12]})")


def _write_all(fd: int, data: memoryview) -> None:
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])


def unpack_span(
    span: Span,
    read: Callable[[int], bytes | memoryview],
    tree: Tree,
    stats: dict[str, os.stat_result],
    decoder: Decoder,
    cpu: AbstractContextManager[object] | None = None,
    buffers: list[bytearray] | None = None,
    named: bool = False,
) -> list[str]:
    """Write `span`'s files into `tree`, reading its stored bytes with `read(n)` (exactly
    n bytes, fewer only where the source ends; valid until the next read): one frame in
    memory at a time, decoded and written while holding `cpu` (a slot of the caller's: reads
    wait for the network, the rest for a CPU). With `buffers` (shared by the holders of the
    slots), each frame is decoded into one of them: one per slot at most, made once, where a
    new frame's memory would be zero-filled and faulted in again and again. The files that
    did not match their entry, or that the source cut short, as problems.

    `named`: the pack's name is the sha256 of its stored bytes (the S3 tier's packs). A span
    that holds the whole pack is then checked once against its name instead of file by file
    (a saver lists each file with the sha256 of the bytes it packed, so an authentic pack
    holds exactly what its entries say); only where it does not match is each file it wrote
    read back, hashed, and removed unless it matches its entry: what is left on disk is
    checked either way."""
    problems: list[str] = []
    by_pack = named and span.whole
    unpacker = Unpacker(span, tree, stats, problems, check=not by_pack)
    pack_digest = hashlib.sha256() if by_pack else None
    offset = span.offset
    slot = cpu if cpu is not None else contextlib.nullcontext()
    try:
        for frame in span.frames:
            stored = read(frame.stored)
            if pack_digest is not None:
                pack_digest.update(stored)
            with slot:
                out = None
                if buffers is not None:  # list.pop and append are atomic
                    out = buffers.pop() if buffers else bytearray(FRAME_BYTES)
                try:
                    unpacker.feed(offset, decoder.decode(frame, stored, out))
                finally:
                    if out is not None and buffers is not None:
                        buffers.append(out)
            offset += frame.size
    except FrameError as exc:
        problems.append(f"damaged: pack {span.pack[:12]}: {exc}")
    except BaseException:
        unpacker.abandon()
        raise
    unpacker.finish()
    if pack_digest is not None and pack_digest.hexdigest() != span.pack:
        unpacker.recheck()
    return problems


def written(digest: str, made: Seal, stats: dict[str, os.stat_result]) -> Fresh:
    """What a fetch that wrote manifest `digest`, the directories and files of `made` (its
    seal) and checked every byte vouches for: each listed file's inode and ctime from `stats`
    (taken as it was written) beside them (store.seal.Fresh)."""
    names = made.listed.names if made.listed is not None else []
    inodes = [stats[rel].st_ino for rel in names]
    return Fresh(digest, made, inodes, [stats[rel].st_ctime_ns for rel in names])


def write_empty(entries: Index, tree: Tree, stats: dict[str, os.stat_result]) -> list[str]:
    """Create the empty files among `entries` (they need no bytes from any pack)."""
    empty_sha = sha256_hex(b"")
    span = Span("", 0, 0, 0, (), ())
    problems: list[str] = []
    unpacker = Unpacker(span, tree, stats, problems)
    for rel, e in sorted(entries.items()):
        if e.size == 0:
            if e.sha256 != empty_sha:
                problems.append(f"altered: {rel} (empty, with another sha256)")
                continue
            fd = unpacker.create(rel)
            try:
                unpacker.done(rel, e, fd)
            finally:
                os.close(fd)
    return problems
