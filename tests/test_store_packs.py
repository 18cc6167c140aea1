"""The remote tiers' pack format (ci_fxcache/store/remote/packs.py) and the S3 tier's segment
encoding (store/remote/s3/index.py): real files, real zstd, no server. The S3 round trips
are in test_store_s3_data.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import zstandard

from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import index
from ci_fxcache.store.remote.tier import RemoteCorrupt

F = packs.FRAME_BYTES
TEXT = b"def kernel(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n"


def _scope(root: Path, sizes: dict[str, int]) -> dict[str, Any]:
    """Files of the given sizes (half random, half text) and their manifest entries."""
    files: dict[str, Any] = {}
    for rel, n in sizes.items():
        data = (os.urandom(n // 2) + TEXT * (n // len(TEXT) + 1))[:n]
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[rel] = {"size": n, "sha256": hashlib.sha256(data).hexdigest()}
    return files


def _packed(scope: Path, files: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Index entries and pack bodies, as a save makes them."""
    entries: dict[str, Any] = {}
    bodies: dict[str, bytes] = {}
    for chunk in packs.chunks(sorted(files), files):
        body, placed = packs.build(scope, chunk, files)
        name = packs.sha256_hex(body)
        bodies[name] = body
        assert {e.pack for e in placed.values()} == {name}  # named by its stored bytes
        entries.update(placed)
    return entries, bodies


def _unpack(
    entries: dict[str, Any],
    bodies: dict[str, bytes],
    target: Path,
    range_bytes: int,
    buffers: list[bytearray] | None = None,
    named: bool = False,
) -> tuple[dict[str, os.stat_result], list[str]]:
    target.mkdir()
    tree = packs.Tree(str(target))  # directories made as files need them
    stats: dict[str, os.stat_result] = {}
    problems = packs.write_empty(entries, tree, stats)
    for span in packs.spans(entries, range_bytes):
        read = io.BytesIO(bodies[span.pack][span.start : span.end]).read
        problems += packs.unpack_span(
            span, read, tree, stats, packs.Decoder(), None, buffers, named=named
        )
    return stats, problems


SIZES = {
    "inductor/fxgraph/aa/empty": 0,
    "inductor/fxgraph/aa/small": 700,
    "inductor/fxgraph/bb/frame": F,
    "inductor/fxgraph/bb/over": F + 1,
    "triton/k1/kernel.so": 2 * F + 12345,
    "triton/k2/kernel.so": 3000,
    "inductor/aotautograd/cc/entry": 40000,
    "inductor/fxgraph/dd/empty2": 0,
}


@pytest.mark.parametrize("range_bytes", [1, F, 64 * F])
def test_files_of_every_size_round_trip_through_frames_and_ranges(
    tmp_path: Path, range_bytes: int
) -> None:
    files = _scope(tmp_path / "src", SIZES)
    entries, bodies = _packed(tmp_path / "src", files)
    spans = packs.spans(entries, range_bytes)
    for rel, e in entries.items():  # one reader writes each file: no span cuts one
        if e.size:
            (holder,) = [s for s in spans if any(r == rel for r, _e in s.files)]
            assert holder.offset <= e.offset
            assert e.offset + e.size <= holder.offset + packs.decoded_size(holder.frames)
    buffers: list[bytearray] = []  # frames decoded into one reused buffer, as a fetch does
    for out, pool in (("out", None), ("pooled", buffers)):
        stats, problems = _unpack(entries, bodies, tmp_path / out, range_bytes, pool)
        assert problems == []
        assert sorted(stats) == sorted(SIZES)
        for rel in SIZES:
            assert (tmp_path / out / rel).read_bytes() == (tmp_path / "src" / rel).read_bytes()
            assert stats[rel].st_size == SIZES[rel]
    assert len(buffers) == 1  # made once, given back after each frame


def test_frames_are_bounded_compressed_where_it_pays_and_raw_where_not(tmp_path: Path) -> None:
    sizes = {"inductor/fxgraph/aa/text": 3 * F, "triton/k/kernel.so": F}
    (tmp_path / "inductor/fxgraph/aa").mkdir(parents=True)
    (tmp_path / "inductor/fxgraph/aa/text").write_bytes((TEXT * (3 * F // len(TEXT) + 1))[: 3 * F])
    (tmp_path / "triton/k").mkdir(parents=True)
    (tmp_path / "triton/k/kernel.so").write_bytes(os.urandom(F))
    files = {
        rel: {"size": n, "sha256": hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest()}
        for rel, n in sizes.items()
    }
    entries, bodies = _packed(tmp_path, files)
    (body,) = bodies.values()
    frames = entries["triton/k/kernel.so"].frames
    assert all(f.size <= F for f in frames)
    assert [f.codec for f in frames] == ["zstd"] * 3 + ["raw"], frames  # text first: by kind
    assert len(body) == sum(f.stored for f in frames) < F + F // 100
    assert packs.frames_problem([list(f) for f in frames]) is None


@pytest.mark.parametrize(
    ("named", "range_bytes"),
    [(False, F), (True, F), (True, 64 * F)],
    ids=["files", "ranges", "whole"],
)
def test_a_file_that_differs_from_its_entry_is_never_left_on_disk(
    tmp_path: Path, named: bool, range_bytes: int
) -> None:
    """File by file, or (`whole`) a pack read whole and checked by its name: a flipped byte
    that still decodes, or a pack cut short, leaves only files that match their entries."""
    files = _scope(tmp_path / "src", SIZES)
    entries, bodies = _packed(tmp_path / "src", files)
    (name,) = bodies
    wholes = {s.whole for s in packs.spans(entries, range_bytes)}
    assert wholes == {range_bytes > F}  # read whole only where one range holds the pack
    frames = entries["triton/k1/kernel.so"].frames
    # Flip a byte in the raw middle of the big file: its frame still decodes, its hash fails.
    at = next(sum(f.stored for f in frames[:i]) for i, f in enumerate(frames) if f.codec == "raw")
    body = bytearray(bodies[name])
    body[at + 10] ^= 1
    stats, problems = _unpack(
        entries, {name: bytes(body)}, tmp_path / "out", range_bytes, None, named
    )
    (problem,) = problems
    assert problem.startswith("altered: ") and "kernel.so" in problem, problems
    assert not any("kernel.so" in p.name and "k1" in str(p) for p in (tmp_path / "out").rglob("*"))
    assert "triton/k1/kernel.so" not in stats
    for rel in stats:  # the rest is there, and whole
        assert (tmp_path / "out" / rel).read_bytes() == (tmp_path / "src" / rel).read_bytes()
    # Cut short: what the stream did not complete is a problem and is not left behind.
    cut = {name: bodies[name][:-100]}
    stats, problems = _unpack(entries, cut, tmp_path / "cut", range_bytes, None, named)
    assert problems and all(not (tmp_path / "cut" / rel).exists() for rel in stats.keys() ^ SIZES)
    for rel in stats:
        assert (tmp_path / "cut" / rel).read_bytes() == (tmp_path / "src" / rel).read_bytes()


def test_a_pack_read_whole_is_checked_by_its_name_not_file_by_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the pack is named by the sha256 of its stored bytes (S3) and a span holds all of
    them, no file is hashed: the stored bytes are, once (a fifth as many for Inductor's
    files). Not so for a pack named otherwise (the GitHub tier's archive) or read in part."""
    files = _scope(tmp_path / "src", SIZES)
    entries, bodies = _packed(tmp_path / "src", files)
    hashed: list[int] = []
    real = packs.sha256_hex
    monkeypatch.setattr(packs, "sha256_hex", lambda data: hashed.append(len(data)) or real(data))
    stats, problems = _unpack(entries, bodies, tmp_path / "whole", 64 * F, None, named=True)
    assert problems == [] and sorted(stats) == sorted(SIZES)
    for rel in SIZES:
        assert (tmp_path / "whole" / rel).read_bytes() == (tmp_path / "src" / rel).read_bytes()
    assert hashed == [0]  # write_empty's sha256 of no bytes, and no file's
    _unpack(entries, bodies, tmp_path / "unnamed", 64 * F, None, named=False)
    assert len(hashed) > 1


def test_a_range_never_leaves_a_tail_of_less_than_half_a_range(tmp_path: Path) -> None:
    """A pack a little larger than a range is read whole: one request, checked by its name."""
    files = _scope(tmp_path / "src", SIZES)
    entries, bodies = _packed(tmp_path / "src", files)
    (body,) = bodies.values()
    for range_bytes in (len(body) - 1, len(body) * 2 // 3 + 1):
        (span,) = packs.spans(entries, range_bytes)
        assert span.whole and (span.start, span.end) == (0, len(body))
    cut = packs.spans(entries, F)
    assert len(cut) > 1 and not any(s.whole for s in cut)
    assert min(s.end - s.start for s in cut) >= F // 2


def test_a_frame_that_would_decode_to_more_than_its_table_says_is_refused(tmp_path: Path) -> None:
    """A zstd bomb in a pack: 64 MiB of zeros in a frame the table calls 4 MiB (its header
    is checked before anything is allocated), and a frame without a content size."""
    cctx = zstandard.ZstdCompressor(level=1)
    bomb = cctx.compress(bytes(64 * 1024 * 1024))  # the header says 64 MiB
    no_size = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(bytes(F + 1))
    decoder = packs.Decoder()
    for stored in (bomb, no_size):
        for out in (None, bytearray(F)):
            with pytest.raises(packs.FrameError):
                decoder.decode(packs.Frame(F, len(stored), "zstd"), stored, out)
    # Into a buffer, nothing is decoded past the table's size: a frame followed by more
    # bytes that decode (another frame inside the same stored size) is refused.
    small = cctx.compress(b"x" * 1000)
    with pytest.raises(packs.FrameError, match="another size"):
        decoder.decode(packs.Frame(1000, 2 * len(small), "zstd"), small + small, bytearray(F))
    assert decoder.decode(packs.Frame(1000, len(small), "zstd"), small, bytearray(F)) == b"x" * 1000


def _segment_entries(tmp_path: Path) -> tuple[dict[str, Any], set[str]]:
    files = _scope(tmp_path / "src", {"inductor/fxgraph/aa/a": 5000, "triton/k/k.so": F + 7})
    entries, bodies = _packed(tmp_path / "src", files)
    return entries, set(bodies)


def test_a_segment_round_trips_with_its_frame_tables(tmp_path: Path) -> None:
    entries, names = _segment_entries(tmp_path)
    raw = index.encode_segment(entries)
    assert raw.startswith(b"\x28\xb5\x2f\xfd") and raw == index.encode_segment(dict(entries))
    back = index.decode_segment(raw, "d" * 64, names)
    assert back == entries
    with pytest.raises(RemoteCorrupt, match="not listed by the head"):
        index.decode_segment(raw, "d" * 64, set())


def test_a_first_format_segment_is_read_with_raw_frames() -> None:
    pack = "a" * 64
    entry = {"sha256": "b" * 64, "size": 2 * F + 3, "offset": 10, "pack": pack}
    segment = {"schema": "fxcache-s3-segment/1", "files": {"inductor/fxgraph/x/y": entry}}
    raw = gzip.compress(json.dumps(segment).encode())
    (got,) = index.decode_segment(raw, "d" * 64, {pack}).values()
    assert [(f.size, f.codec) for f in got.frames] == [(F, "raw"), (F, "raw"), (13, "raw")]


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_a_segment_bomb_is_refused_without_being_expanded(kind: str) -> None:
    """A segment that decodes to more than MAX_SEGMENT_JSON: refused at that bound (the
    decoded bytes are never all in memory; test_store_s3_data measures a real restore)."""
    body = (
        b'{"schema": "fxcache-s3-segment/2", "files": {}, "pad": "'
        + b" " * (index.MAX_SEGMENT_JSON + 10)
        + b'"}'
    )
    raw = gzip.compress(body, 1) if kind == "gzip" else zstandard.ZstdCompressor().compress(body)
    assert len(raw) < index.MAX_SEGMENT_JSON // 100
    with pytest.raises(RemoteCorrupt, match="unreadable"):
        index.decode_segment(raw, "d" * 64, set())


@pytest.mark.parametrize(
    "table",
    [
        [[F + 1, 10, "zstd"]],  # a frame larger than a reader holds
        [[10, 11, "raw"]],  # raw, yet stored and decoded sizes differ
        [[10, 5, "lz4"]],
        [[True, 5, "zstd"]],
        "not a list",
    ],
)
def test_a_malformed_frame_table_is_refused(table: object) -> None:
    pack = "a" * 64
    data = {"schema": "fxcache-s3-segment/2", "packs": {pack: table},
            "files": {"inductor/fxgraph/x/y": {"sha256": "b" * 64, "size": 5, "offset": 0,
                                                "pack": pack}}}  # fmt: skip
    raw = zstandard.ZstdCompressor().compress(json.dumps(data).encode())
    with pytest.raises(RemoteCorrupt, match="frame table"):
        index.decode_segment(raw, "d" * 64, {pack})


def test_an_entry_past_its_packs_frames_is_refused() -> None:
    pack = "a" * 64
    data = {"schema": "fxcache-s3-segment/2", "packs": {pack: [[100, 50, "zstd"]]},
            "files": {"inductor/fxgraph/x/y": {"sha256": "b" * 64, "size": 60, "offset": 41,
                                                "pack": pack}}}  # fmt: skip
    raw = zstandard.ZstdCompressor().compress(json.dumps(data).encode())
    with pytest.raises(RemoteCorrupt, match="malformed"):
        index.decode_segment(raw, "d" * 64, {pack})


def test_reads_wait_outside_the_cpu_slot_and_decoding_and_writing_hold_it(tmp_path: Path) -> None:
    """A fetch runs more connections than CPUs: a reader waits for the network without a
    CPU slot, and decodes, hashes and writes only while it holds one."""
    files = _scope(tmp_path / "src", SIZES)
    entries, bodies = _packed(tmp_path / "src", files)
    slot = threading.BoundedSemaphore(1)

    def free() -> bool:
        if slot.acquire(blocking=False):
            slot.release()
            return True
        return False

    while_reading: list[bool] = []
    while_decoding: list[bool] = []

    class Watched(packs.Decoder):
        def decode(
            self, frame: packs.Frame, stored: bytes | memoryview, out: bytearray | None = None
        ) -> bytes | memoryview:
            while_decoding.append(free())
            return super().decode(frame, stored, out)

    (tmp_path / "out").mkdir()
    tree = packs.Tree(str(tmp_path / "out"))
    stats: dict[str, os.stat_result] = {}
    for span in packs.spans(entries, F):
        source = io.BytesIO(bodies[span.pack][span.start : span.end])

        def read(n: int, source: io.BytesIO = source) -> bytes:
            while_reading.append(free())
            return source.read(n)

        assert packs.unpack_span(span, read, tree, stats, Watched(), slot, []) == []
    assert while_reading and all(while_reading)
    assert while_decoding and not any(while_decoding)
    assert sorted(stats) == sorted(rel for rel, n in SIZES.items() if n)


def test_threads_creating_files_in_the_same_new_directories_each_make_them_once(
    tmp_path: Path,
) -> None:
    tree = packs.Tree(str(tmp_path))
    rels = [
        f"inductor/fxgraph/{d:02x}/{t}-{i}" for d in range(40) for t in range(8) for i in range(5)
    ]
    errors: list[BaseException] = []

    def create(mine: list[str]) -> None:
        try:
            for rel in mine:
                os.close(tree.create(rel))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(rels[t::8],)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()
    ) == sorted(rels)
    assert set(tree.stamps()) == {"inductor", "inductor/fxgraph"} | {
        f"inductor/fxgraph/{d:02x}" for d in range(40)
    }
    with pytest.raises(FileExistsError):  # each file is created once, never written through
        tree.create(rels[0])
