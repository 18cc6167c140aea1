"""The S3 tier's index at scale (issue 40): the writer splits segments within every bound a
reader enforces (a million entries without a server; 250,000 files through the real CLI and
SeaweedFS), and a segment that cannot be read is never dropped silently: the next save warns
and repairs what it can. The fixtures and helpers are test_store_s3.py's."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import index
from ci_fxcache.store.remote.s3.client import parse_url
from ci_fxcache.store.remote.s3.objects import S3Objects
from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE, tree_digest, write_files
from tests.test_store_s3 import (
    _compiles_into,
    _first_job,
    _objects,
    _save_json,
    _store,
    _warnings,
)
from tests.test_store_s3 import bucket as bucket  # the fixture
from tests.test_store_s3_data import _peak_rss_mib


def inductor_paths(count: int, folders: int = 0, seed: int = 0) -> list[str]:
    """`count` distinct paths shaped like Inductor's and Triton's (two base32 hashes of 51-52
    characters per FX graph entry, one per Triton kernel directory): ~110-125 characters.
    `folders`: that many graph and kernel folders shared by all (fewer directories to make;
    the names compress a little better), else one per file as Inductor makes them."""
    rng = random.Random(seed)
    # Every name is 52 characters of one base32 text: 35 random bytes are 56 characters that
    # owe nothing to their neighbours, so one encode serves all (1M paths: 2 s, not 11).
    hashes = folders + count + (0 if folders else count)
    text = base64.b32encode(rng.randbytes(35 * hashes)).decode().lower()
    names = iter(text[i : i + 52] for i in range(0, len(text), 56))
    shared = [next(names) for _ in range(folders)]
    paths = []
    for i in range(count):
        folder = shared[i % folders] if folders else next(names)
        if i % 3:
            key = "f" + folder[:51]
            paths.append(f"inductor/fxgraph/{key[1:3]}/{key}/{next(names)}")
        else:
            paths.append(f"triton/{folder}/triton_poi_fused_add_mul_{i}.cubin")
    return paths


def _entries(count: int) -> packs.Index:
    """Index entries of `count` files in packs of 5,000 (8 frames each), random digests."""
    rng = random.Random(1)
    names = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(count // 5000 + 1)]
    table = [packs.Frame(packs.FRAME_BYTES, 1 << 20, packs.ZSTD)] * 8
    digests = rng.randbytes(32 * count).hex()
    return {
        rel: packs.Entry(digests[64 * i : 64 * i + 64], rng.randint(1, 60000),
                         rng.randint(0, 28 << 20), names[i // 5000], table)
        for i, rel in enumerate(inductor_paths(count))
    }  # fmt: skip


def _read_back(segments: list[index.Segment]) -> dict[str, Any]:
    """What readers make of the segments, each within the readers' bounds."""
    found: dict[str, Any] = {}
    for seg in segments:
        assert len(seg.raw) <= index.MAX_SEGMENT_OBJECT and index.within_bounds(seg.raw)
        files = index.decode_segment(seg.raw, "d" * 64, set(seg.packs))
        assert len(files) == seg.files and not found.keys() & files.keys()
        found.update(files)
    return found


@pytest.mark.slow
def test_a_million_files_are_written_as_segments_every_reader_accepts() -> None:
    """One segment of 1M Inductor-shaped entries would be ~110 MB stored (a reader takes 16
    MiB): the writer splits it, and the readers get every entry back."""
    entries = _entries(1_000_000)
    segments = index.encode_segments(entries)
    assert len(segments) == -(-len(entries) // index.SEGMENT_FILES)
    assert _read_back(segments) == entries


def test_segments_do_not_depend_on_the_order_entries_come_in() -> None:
    """Two segments' worth (the split is the same rule at any count), encoded in either
    order: the same objects, so savers that agree publish the same names."""
    entries = _entries(index.SEGMENT_FILES + 5000)
    segments = index.encode_segments(entries)
    assert len(segments) == 2
    assert index.encode_segments(dict(reversed(entries.items()))) == segments


def test_a_segment_over_a_bound_is_halved_until_every_part_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The per-segment file count is the rule; the bounds themselves are enforced by halving
    (here bounds far below what 5,000 entries take)."""
    entries = _entries(5000)
    monkeypatch.setattr(index, "MAX_SEGMENT_OBJECT", 100_000)
    monkeypatch.setattr(index, "MAX_SEGMENT_JSON", 300_000)
    segments = index.encode_segments(entries)
    assert len(segments) > 5
    assert all(len(s.raw) <= 100_000 for s in segments)
    assert _read_back(segments) == entries


def test_an_entry_no_segment_can_hold_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "MAX_SEGMENT_JSON", 100)
    with pytest.raises(index.SegmentTooLarge):
        index.encode_segments(_entries(2))


def _reader(seaweed: SeaweedS3, url: str, monkeypatch: pytest.MonkeyPatch) -> S3Objects:
    """The tier's own reads of the bucket, in this process."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return S3Objects(parse_url(url))


def _head(seaweed: SeaweedS3, url: str) -> tuple[str, dict[str, Any]]:
    (key,) = [k for k in _objects(seaweed, url) if k.endswith("/head.json")]
    s3: Any = seaweed.client()
    name = url.removeprefix("s3://").split("/")[0]
    return key, json.loads(s3.get_object(Bucket=name, Key=key)["Body"].read())


@pytest.mark.slow
def test_a_scope_over_the_old_segment_limit_restores_complete_on_an_empty_runner(
    tmp_path: Path,
    run_fxcache: RunFxcache,
    seaweed: SeaweedS3,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """250,000 files with Inductor-shaped paths: the old writer published one segment over
    the 16 MiB every restore refuses (issue 40 measured 19.0 MB for 230,000 files); now the
    save writes segments within the bounds and an empty runner gets every file back."""
    count = 250_000
    files = {rel: f"{i}\n".encode() for i, rel in enumerate(inductor_paths(count, 2000))}
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a, files)
    _key, head = _head(seaweed, bucket)
    assert head["files"] == count and len(head["segments"]) >= 4, head["segments"]
    merged = _reader(seaweed, bucket, monkeypatch).index(
        Layout(tmp_path / "r"), index.Head.of(head)
    )
    assert len(merged) == count
    assert len(index.encode_segment(merged)) > index.MAX_SEGMENT_OBJECT  # one would be refused
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got, peak = _peak_rss_mib(b, "--store", "s3")
    print(f"restore of {count:,} files: peak RSS {peak:.0f} MiB")  # docs/store.md's figure
    assert got["hit"] and got["remote"]["fetched"] and got["files"] == count, got["remote"]
    assert "error" not in got["remote"] and peak < 2048, (got["remote"], peak)
    # Against the files the first job wrote, not a second tree of 250,000 read back.
    restored = {
        f"{part}/{rel}": digest
        for part in ("inductor", "triton")
        for rel, digest in tree_digest(Path(got["scope_dir"]) / part).items()
    }
    assert restored == {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


def _segment_keys(seaweed: SeaweedS3, url: str) -> list[str]:
    return [k for k in _objects(seaweed, url) if "/segments/" in k]


@pytest.mark.parametrize("damage", ["delete", "flip"])
def test_an_unreadable_segment_warns_and_later_saves_repair_the_index(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, damage: str
) -> None:
    """Runner a saves SAMPLE, runner b adds a file: the head lists two segments. a's segment
    is deleted or altered in the bucket. An empty runner's restore refuses the head (cold,
    one warning); its save warns that the segment's files left the index (the old code
    dropped them without a word) and publishes its own; a's next save publishes SAMPLE again;
    an empty runner then gets every file."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    (first,) = _segment_keys(seaweed, bucket)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got_b = b.restore("--store", "s3")
    write_files(_compiles_into(got_b), {"inductor/fxgraph/bb/from-b": b"b" * 300})
    assert _save_json(b)["remote"]["published"]
    seaweed.damage(bucket, first, damage)
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    cold = c.restore("--store", "s3")
    assert not cold["hit"] and "index segment" in cold["remote"]["error"], cold["remote"]
    write_files(_compiles_into(cold), {"inductor/fxgraph/cc/from-c": b"c" * 300})
    saved = _save_json(c)
    remote = saved["remote"]
    assert remote["published"], remote
    (dropped,) = remote["dropped_segments"]
    assert dropped["sha256"] == first.rsplit("/", 1)[1] and dropped["files"] == len(SAMPLE)
    (warning,) = _warnings(saved["_stderr"])
    assert f"{len(SAMPLE)} file(s) it listed are left out" in warning, warning
    _key, head = _head(seaweed, bucket)
    assert head["files"] == 2  # b's file and c's: SAMPLE is gone from the index, said so
    again = _save_json(a)  # a still has SAMPLE: lacking from the index, published again
    assert again["remote"]["published"] and again["remote"]["files"] == len(SAMPLE), again
    assert _warnings(again["_stderr"]) == [], again["_stderr"]
    d = _store(tmp_path, "d", run_fxcache, seaweed, bucket)
    every = d.restore("--store", "s3")
    assert every["hit"] and every["files"] == len(SAMPLE) + 2, every["remote"]
    added = {"inductor/fxgraph/bb/from-b", "inductor/fxgraph/cc/from-c"}
    assert tree_digest(Path(every["scope_dir"])).keys() >= {*SAMPLE, *added}


@pytest.mark.slow
def test_a_segment_an_older_writer_made_too_large_is_split_by_the_next_save(
    tmp_path: Path,
    run_fxcache: RunFxcache,
    seaweed: SeaweedS3,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's case: a head names one segment over the 16 MiB a restore reads (what the
    old writer published for ~200,000 files). Restores refuse it (cold); the next save reads
    it up to the repair bound and writes it anew as segments within the readers' bounds,
    losing no entry, instead of publishing a head of its own files alone."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    head_key, head = _head(seaweed, bucket)
    reader = _reader(seaweed, bucket, monkeypatch)
    entries = reader.index(Layout(tmp_path / "r"), index.Head.of(head))
    (pack,) = {e.pack for e in entries.values()}
    extent = packs.decoded_size(next(iter(entries.values())).frames)
    rng = random.Random(2)
    for rel in inductor_paths(160_000):  # entries an older save named, into the same pack
        entries[rel] = next(iter(entries.values()))._replace(
            sha256=rng.randbytes(32).hex(), size=1, offset=rng.randrange(extent)
        )
    big = index.encode_segment(entries)
    assert len(big) > index.MAX_SEGMENT_OBJECT and not index.within_bounds(big)
    digest = hashlib.sha256(big).hexdigest()
    s3: Any = seaweed.client()
    name, _, prefix = bucket.removeprefix("s3://").partition("/")
    s3.put_object(Bucket=name, Key=f"{prefix}/segments/{digest}", Body=big)
    head["segments"] = [{"sha256": digest, "files": len(entries), "packs": [pack]}]
    head["files"] = len(entries)
    s3.put_object(Bucket=name, Key=head_key, Body=json.dumps(head).encode())
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    cold = c.restore("--store", "s3")
    assert not cold["hit"] and "too large" in cold["remote"]["error"], cold["remote"]
    write_files(_compiles_into(cold), {"inductor/fxgraph/cc/from-c": b"c" * 300})
    saved = _save_json(c)["remote"]
    assert saved["published"] and saved["rewrote_index"] and "dropped_segments" not in saved
    _key, repaired = _head(seaweed, bucket)
    assert repaired["files"] == len(entries) + 1 and len(repaired["segments"]) >= 3
    for seg in repaired["segments"]:
        raw = s3.get_object(Bucket=name, Key=f"{prefix}/segments/{seg['sha256']}")["Body"]
        assert index.within_bounds(raw.read())
    after = reader.index(Layout(tmp_path / "r2"), index.Head.of(repaired))  # the readers' bounds
    assert after.keys() == {*entries, "inductor/fxgraph/cc/from-c"}
