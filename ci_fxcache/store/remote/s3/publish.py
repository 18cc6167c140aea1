"""Save to S3: upload what the bucket lacks of a committed local scope as new packs and one
new segment, then replace the head.

Only files the head's index lacks are uploaded, deduplicated by sha256 against every pack
the scope references and against the packs this runner uploaded for a save killed before its
head (objects.sent_packs), as one new pack set and one small segment; the head lists segments,
so a save never re-uploads the whole index (segments are merged anew once there are
`MAX_SEGMENTS` more than the index needs). Segments and the head are kept within every bound a
reader enforces (index.encode_segments): a save never publishes what a restore refuses. A
segment of the head that cannot be read is left out with a warning (the save publishes its
runner's files again); one an older writer made too large is read up to the repair bounds and
written anew.

Signing: with a key, a save extends only a head whose signature verifies with that key.
Anything else (unsigned, signed with another key, unreadable) is foreign: the save starts a
fresh head from this job's own verified files (its signed local manifest) and says so; the
same on every re-read after a lost race. A head without a key is extended as it is.

Many writers: a save reads the head with its ETag and replaces it with `If-Match` (or creates
it with `If-None-Match: *`). A lost race re-reads the head, makes its segment cover what the
winner's index lacks, and tries again after a pause drawn at random from an exponentially
growing range ("full jitter"), for as long as the save's time bound (deadline.py) allows, not
a fixed number of attempts. Chosen over one immutable segment per save that readers merge:
that design needs a listing (or many GETs) before every restore's first download, makes
readers merge and verify an unbounded set of objects, and still needs a compaction that
races with writers; a single head keeps a restore at one GET before its packs, and with
jitter 24 savers of one scope at once all publish (tests/test_store_s3_fleet.py). A save
whose bound runs out says so (a warning, `published: false`); its files stay committed
locally and the next save on that runner compares the local manifest with the bucket's index
and publishes them, reusing the packs it already uploaded.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import gha, names
from ci_fxcache.env.cpus import usable_cpus
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import parallel
from ci_fxcache.store.remote.s3.client import S3Conflict, S3Missing, S3Unavailable
from ci_fxcache.store.remote.s3.index import (
    MAX_HEAD_BYTES,
    REPAIR_SEGMENT_JSON,
    REPAIR_SEGMENT_OBJECT,
    SEGMENT_FILES,
    decode_segment,
    encode_head,
    encode_segments,
    new_head,
    parse_head,
    signature_problem,
    within_bounds,
)
from ci_fxcache.store.remote.s3.objects import HeadTooLarge, S3Objects
from ci_fxcache.store.remote.tier import RemoteCorrupt, RemoteUnavailable

MAX_SEGMENTS = 16
# Pauses after a lost race: uniform in [0, min(CAP, FIRST * 2^n)) after the n-th loss.
BACKOFF_FIRST_S = 0.05
BACKOFF_CAP_S = 2.0
# Packs this runner uploaded for a head it never published are reused for this long; the
# garbage collector's minimum grace (invalidate.py) is longer than this plus a save's bound.
ORPHAN_REUSE_S = 30 * 60.0
# Fault injection for the tests, never set in production (store.save's variable):
# `s3-pause:SECONDS` pauses a publish after its packs and segment, before the head's PUT.
FAULT_ENV = names.TEST_FAULT_ENV


def _fault_pause() -> None:
    fault = os.environ.get(FAULT_ENV, "")
    if fault.startswith("s3-pause:"):
        print("fxcache: test fault: packs uploaded, pausing before the head", flush=True)
        time.sleep(float(fault.split(":", 1)[1]))


@dataclass
class _Head:
    """The scope's head as this save may extend it: `head` None when there is none or it is
    foreign (`replaced` says why); `etag` the object's, for the conditional PUT."""

    head: dict[str, Any] | None
    etag: str | None
    replaced: str | None = None


@dataclass
class _Index:
    """The files a head's readable segments give, without entries in packs known bad."""

    files: dict[str, dict[str, Any]]
    # Segments that cannot be read (missing, altered, beyond even the repair bounds): left out
    # of the next head, each with a warning (sha256 -> its file count and why).
    unreadable: dict[str, tuple[int, str]]
    # Entries in bad packs were left out, or a segment is beyond the readers' bounds (an older
    # writer's): the index is written anew, within them.
    rewrite: bool


def publish(
    objects: S3Objects,
    layout: Layout,
    key: str,
    committed: mf.Committed,
    signing_key: str | None,
) -> dict[str, Any]:
    """Upload what the bucket lacks of committed scope `key` (store.remote.tier.RemoteTier):
    the files `committed` lists, never what manifest.json says by now."""
    local = committed.manifest
    files: dict[str, Any] = local["files"]
    bad = objects.bad_packs(layout)
    orphans = {
        rel: e
        for rel, e in objects.sent_packs(layout, key, ORPHAN_REUSE_S, signing_key).items()
        if e["pack"] not in bad
    }
    uploaded: dict[str, dict[str, Any]] = {}  # this save's packs: path -> entry
    sent: set[str] = set()
    current = _current(objects, key, signing_key)
    replaced = current.replaced
    losses = 0
    while True:
        index = _usable_index(objects, layout, current.head, bad)
        lacking = sorted(
            rel for rel, m in files.items() if index.files.get(rel, {}).get("sha256") != m["sha256"]
        )
        if not (lacking or current.head is None or index.unreadable or index.rewrite):
            return {"published": False, "reason": "the bucket has every file",
                        "attempts": losses + 1, **objects.stats()}  # fmt: skip
        known = {e["sha256"]: e for e in (*index.files.values(), *uploaded.values())}
        entries, upload = _reused(lacking, files, known, orphans)
        if upload:
            fresh, names = _upload_packs(objects, layout, key, upload, files, signing_key)
            sent |= names
            uploaded.update(fresh)
            entries.update(fresh)
        new_segs = _put_segments(objects, entries)
        composed = _compose(objects, key, current, index, new_segs, entries, local, signing_key)
        body = _head_body(composed)
        if losses == 0:
            _fault_pause()
        try:
            objects.bucket.put(objects.head_key(key), body, if_match=current.etag,
                               if_absent=current.etag is None,
                               content_type="application/json")  # fmt: skip
            break
        except S3Conflict:
            losses += 1
            _pause(objects, losses)
            current = _current(objects, key, signing_key)
            replaced = replaced or current.replaced
        except (S3Unavailable, S3Missing) as exc:
            raise RemoteUnavailable(str(exc)) from None
    named = _settle(objects, layout, key, bad, sent, orphans, composed)
    dropped = _warn_dropped(objects, key, index, len(entries))
    return {
        "published": True,
        "files": len(entries),
        "new_packs": len(sent),
        "uploaded_files": len(uploaded),
        "reused_orphans": len({e["pack"] for e in orphans.values()} & named),
        "attempts": losses + 1,
        "head_files": composed["files"],
        "head_bytes": composed["total_bytes"],
        "segments": len(composed["segments"]),
        "rewrote_index": index.rewrite,
        "replaced": replaced,
        **({"dropped_segments": dropped} if dropped else {}),
        **objects.stats(),
    }


def _reused(
    lacking: list[str],
    files: dict[str, Any],
    known: dict[str, dict[str, Any]],
    orphans: dict[str, dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Of the files the index lacks: the entries of those already in a pack (the index's,
    this save's, or one this runner sent for a save killed before its head), and the paths
    still to upload."""
    entries: dict[str, dict[str, Any]] = {}
    upload: list[str] = []
    for rel in lacking:
        sha = files[rel]["sha256"]
        found = known.get(sha) or orphans.get(rel)
        if found is not None and found["sha256"] == sha:
            entries[rel] = {**found}
        else:
            upload.append(rel)
    return entries, upload


def _head_body(composed: dict[str, Any]) -> bytes:
    """The head's bytes; RemoteUnavailable when a restore would refuse them (never
    published)."""
    body = encode_head(composed)
    if len(body) > MAX_HEAD_BYTES:
        raise RemoteUnavailable(
            f"not published: the head would be {len(body):,} bytes, more than a restore "
            f"reads ({MAX_HEAD_BYTES:,})"
        )
    return body


def _settle(
    objects: S3Objects,
    layout: Layout,
    key: str,
    bad: set[str],
    sent: set[str],
    orphans: dict[str, dict[str, Any]],
    composed: dict[str, Any],
) -> set[str]:
    """After the head's PUT: packs uploaded again, whole, are good from now on; the sent
    records the head now names are forgotten. The packs the head names."""
    if bad & sent:
        objects.set_bad(layout, bad - sent)
    named = {p for seg in composed["segments"] for p in seg["packs"]}
    objects.forget_sent(layout, key, named & (sent | {e["pack"] for e in orphans.values()}))
    return named


def _packs_of(entries: dict[str, dict[str, Any]]) -> list[str]:
    return sorted({e["pack"] for e in entries.values()})


def _warn_dropped(
    objects: S3Objects, key: str, index: _Index, published: int
) -> list[dict[str, Any]]:
    """One warning per segment of the head that could not be read: its entries are gone
    from the bucket's index; this save published what this runner has of them (`published`:
    every file of this runner's that the readable index lacked)."""
    dropped = []
    for digest, (count, why) in sorted(index.unreadable.items()):
        gha.warn(
            f"{objects.describe()}: {why}; the {count:,} file(s) it listed are left out of "
            f"the index of {key}; this save published the {published:,} file(s) of this "
            "runner's that the index lacked, and later saves publish those of theirs"
        )
        dropped.append({"sha256": digest, "files": count, "why": why})
    return dropped


def _pause(objects: S3Objects, losses: int) -> None:
    """Wait before the next attempt (full jitter); RemoteUnavailable when the save's time
    bound would run out first."""
    pause = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2 ** (losses - 1)))
    if objects.deadline.left() <= pause:
        raise RemoteUnavailable(
            f"the head kept changing ({losses} attempts within the {objects.deadline.seconds:g} "
            "s bound); the next save on this runner publishes these files"
        )
    time.sleep(pause)


def _current(objects: S3Objects, key: str, signing_key: str | None) -> _Head:
    """The head to extend: one that is unreadable, or (with a key) not signed with the key,
    is foreign and replaced (its ETag kept for the conditional PUT)."""
    try:
        got = objects.head_object(key)
    except HeadTooLarge as exc:
        return _Head(None, exc.etag, str(exc))
    if got is None:
        return _Head(None, None)
    body, etag = got
    try:
        head = parse_head(body, key)
    except RemoteCorrupt as exc:
        return _Head(None, etag, f"unreadable: {exc}")
    if signing_key:
        problem = signature_problem(head, signing_key)
        if problem:
            return _Head(None, etag, problem)
    return _Head(head, etag)


def _usable_index(
    objects: S3Objects, layout: Layout, head: dict[str, Any] | None, bad: set[str]
) -> _Index:
    """The head's index without entries in bad packs, and the segments that could not be
    read (left out of the next head). A segment beyond the readers' bounds (an older writer
    made it) is read up to the repair bounds and written anew within them."""
    if head is None:
        return _Index({}, {}, False)
    merged: dict[str, dict[str, Any]] = {}
    unreadable: dict[str, tuple[int, str]] = {}
    oversize = False
    for seg in head["segments"]:
        digest = seg["sha256"]
        try:
            raw = objects.segment_bytes(layout, digest, REPAIR_SEGMENT_OBJECT)
            merged.update(decode_segment(raw, digest, set(seg["packs"]), REPAIR_SEGMENT_JSON))
        except RemoteCorrupt as exc:
            unreadable[digest] = (seg["files"], str(exc))
            continue
        oversize = oversize or not within_bounds(raw)
    usable = {rel: e for rel, e in merged.items() if e["pack"] not in bad}
    return _Index(usable, unreadable, oversize or len(usable) != len(merged))


def _upload_packs(
    objects: S3Objects,
    layout: Layout,
    key: str,
    upload: list[str],
    files: dict[str, Any],
    signing_key: str | None,
) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """Upload `upload` (paths of scope `key`) as packs: their entries, and the packs' names.
    Each pack is built into a file of this runner's (objects.spool) as its frames are made,
    then sent from it (parts of a large one as they are read): at most usable_cpus() workers
    build at once (three frames each), the others each hold one part of an upload, whatever
    the files' sizes. Each pack is remembered once in the
    bucket (objects.record_sent). A file that no longer matches its manifest entry is left
    out (never published)."""
    scope: Path = layout.scope(key)
    chunks = list(packs.chunks(upload, files))
    lock = threading.Lock()
    names: set[str] = set()
    entries: dict[str, dict[str, Any]] = {}

    cpu = threading.BoundedSemaphore(usable_cpus())  # building is CPU work: no more at once

    def send(index: str) -> None:
        with objects.spool(layout) as out:  # the pack on disk, never whole in memory
            with cpu:
                name, placed = packs.build_into(scope, chunks[int(index)], files, out)
            objects.bucket.put_file(objects.pack_key(name), out, out.tell())
        objects.record_sent(layout, key, name, placed, signing_key)
        with lock:
            names.add(name)
            for rel, e in placed.items():
                entries[rel] = {**e, "pack": name}

    try:
        parallel.run(send, [str(i) for i in range(len(chunks))])
    except (S3Unavailable, S3Missing, S3Conflict) as exc:
        raise RemoteUnavailable(str(exc)) from None
    return entries, names


def _put_segments(objects: S3Objects, entries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Upload `entries` as segments within the readers' bounds; how the head lists them."""
    refs = []
    try:
        for segment in encode_segments(entries):
            ref = segment.ref()
            objects.bucket.put(objects.segment_key(ref["sha256"]), segment.raw)
            refs.append(ref)
    except (S3Unavailable, S3Missing, S3Conflict) as exc:
        raise RemoteUnavailable(str(exc)) from None
    return refs


def _compose(
    objects: S3Objects,
    key: str,
    current: _Head,
    index: _Index,
    new_segs: list[dict[str, Any]],
    entries: dict[str, dict[str, Any]],
    local: dict[str, Any],
    signing_key: str | None,
) -> dict[str, Any]:
    """The next head: the current one's readable segments plus ours (all merged anew when
    there are MAX_SEGMENTS more than the merged index needs, or when the index must be
    rewritten), with the merged index's true file count and bytes."""
    head = current.head
    merged = {**index.files, **entries}
    segments = [s for s in (head or {}).get("segments", []) if s["sha256"] not in index.unreadable]
    segments += new_segs
    needed = -(-len(merged) // SEGMENT_FILES)
    if len(segments) > MAX_SEGMENTS + needed or index.rewrite:
        segments = _put_segments(objects, merged)
    return new_head(key, head, segments, local, merged, signing_key)
