"""Save to S3: upload what the bucket lacks of a committed local scope as new packs and one
new segment, then the head (or, when another writer changed it first, a reference).

Only files the bucket's view (the head's index and its references, refs.py) lacks are
uploaded, deduplicated by sha256 against every pack
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
fresh head from this job's own verified files (its signed local manifest) and the
references that verify, and says so. A head without a key is extended as it is.

Many writers (refs.py): a save reads the head with its ETag and lists the scope's references
(reading them only when it folds: refs.folds), and makes one conditional PUT (`If-Match`, or
`If-None-Match: *` for a first head) of a head that folds in every reference it read plus
its own segments; it is never retried. When another writer changed the head first, the save
writes its own immutable reference instead (a unique name: it cannot lose), and readers
merge it until a later save's fold or the scheduled `fxcache invalidate --s3` takes it into
the head. A save that does not fold writes its reference without trying the head. So every
save publishes with one attempt and a fixed number of requests besides the references it
reads (refs.FOLD_READS on average, at most refs.MAX_REFS), whatever the number of runners.
Chosen by measurement over re-reading and retrying the head (benchmarks/sim_savers.py,
docs/store.md: at 500 savers at once 85 / 167 attempts and up to 468 s to publish, against 1
attempt, 6 requests and 1.1 s here). A save whose time bound runs out says so (a warning,
`published: false`); its files stay committed locally and the next save on that runner
compares the local manifest with the bucket's index and publishes them, reusing the packs it
already uploaded.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import gha, names
from ci_fxcache.env.cpus import usable_cpus
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import parallel, refs
from ci_fxcache.store.remote.s3.client import S3Conflict, S3Missing, S3Unavailable
from ci_fxcache.store.remote.s3.index import (
    MAX_HEAD_BYTES,
    REF_SCHEMA,
    REPAIR_SEGMENT_JSON,
    REPAIR_SEGMENT_OBJECT,
    SEGMENT_FILES,
    Head,
    SegmentRef,
    decode_segment,
    encode_head,
    encode_segments,
    new_head,
    parse_head,
    signature_problem,
    within_bounds,
)
from ci_fxcache.store.remote.s3.objects import HeadTooLarge, S3Objects
from ci_fxcache.store.remote.tier import Published, RemoteCorrupt, RemoteUnavailable

MAX_SEGMENTS = 16
# Packs this runner uploaded for a head it never published are reused for this long; the
# garbage collector's minimum grace (invalidate.py) is longer than this plus a save's bound.
ORPHAN_REUSE_S = 30 * 60.0
# Fault injection for the tests, never set in production (store.save's variable):
# `s3-pause:SECONDS` pauses a publish after its packs and segment, before the head's (or its
# reference's) PUT.
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

    head: Head | None
    etag: str | None
    replaced: str | None = None


@dataclass
class _Index:
    """The files a head's readable segments give, without entries in packs known bad."""

    files: packs.Index
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
) -> Published:
    """Upload what the bucket lacks of committed scope `key` (store.remote.tier.RemoteTier):
    the files `committed` lists, never what manifest.json says by now."""
    local = committed.manifest
    files: dict[str, Any] = local["files"]
    bad = objects.bad_packs(layout)
    orphans = {
        rel: e
        for rel, e in objects.sent_packs(layout, key, ORPHAN_REUSE_S, signing_key).items()
        if e.pack not in bad
    }
    current = _current(objects, key, signing_key)
    listed = refs.names(objects, key, signing_key, refs.MAX_REFS)
    folds = refs.folds(listed.names)
    found = (
        refs.read_listed(objects, layout, key, signing_key, listed) if folds else refs.Found()
    )  # a save that does not fold reads no reference: it writes its own
    index = _usable_index(objects, layout, current.head, bad)
    view = {**index.files, **{r: e for r, e in found.files().items() if e.pack not in bad}}
    lacking = sorted(
        rel for rel, m in files.items() if rel not in view or view[rel].sha256 != m["sha256"]
    )
    if not (lacking or current.head is None or index.unreadable or index.rewrite or found.refs):
        removed = _remove_junk(objects, key, listed, signing_key)
        return Published(
            False,
            "the bucket has every file",
            counts={"attempts": 1, "refs_removed": removed, **objects.stats()},
        )
    entries, upload = _reused(lacking, files, {e.sha256: e for e in view.values()}, orphans)
    uploaded: packs.Index = {}
    sent: set[str] = set()
    if upload:
        uploaded, sent = _upload_packs(objects, layout, key, upload, files, signing_key)
        entries.update(uploaded)
    own = _put_segments(objects, entries) if entries else []
    composed = (
        _compose(objects, key, current, index, found, own, entries, local, signing_key)
        if folds else None
    )  # fmt: skip
    _fault_pause()
    via = _put_once(objects, key, current, composed, own, entries, local, signing_key)
    removed = _remove_junk(objects, key, listed, signing_key)
    if via == "none":
        return Published(False, "the bucket has every file; its references wait for a later fold",
                         counts={"attempts": 1, "refs_listed": len(listed.names),
                                 "refs_removed": removed, **objects.stats()})  # fmt: skip
    head = composed if via == "head" else None
    folded = refs.delete(objects, key, [r.name for r in found.refs]) if head else 0
    named = _settle(objects, layout, bad, sent, orphans, head.segments if head else own, key)
    dropped = _warn_dropped(objects, key, index, len(entries)) if via == "head" else []
    counts = {
        "files": len(entries),
        "new_packs": len(sent),
        "uploaded_files": len(uploaded),
        "reused_orphans": len({e.pack for e in orphans.values()} & named),
        "attempts": 1,
        "refs_listed": len(listed.names),
        "refs_read": len(found.refs),
        "refs_folded": folded,
        "refs_removed": removed,
        "head_files": composed.files if composed else None,
        "head_bytes": composed.total_bytes if composed else None,
        "segments": len(composed.segments if composed else own),
        "rewrote_index": index.rewrite and via == "head",
        **({"dropped_segments": dropped} if dropped else {}),
        **objects.stats(),
    }
    return Published(True, via=via, replaced=current.replaced if via == "head" else None,
                     counts=counts)  # fmt: skip


def _put_once(
    objects: S3Objects,
    key: str,
    current: _Head,
    composed: Head | None,
    own: list[SegmentRef],
    entries: packs.Index,
    local: dict[str, Any],
    signing_key: str | None,
) -> str:
    """One conditional PUT over `current` of the folded head `composed` (None: this save
    does not fold), never retried; when another writer changed the head first, this save's
    own reference instead (refs.py), which cannot lose. How it published: "head",
    "reference", or "none" (no fold, and nothing of its own)."""
    try:
        if composed is not None:
            body = _head_body(composed)
            objects.bucket.put(objects.head_key(key), body, if_match=current.etag,
                               if_absent=current.etag is None,
                               content_type="application/json")  # fmt: skip
            return "head"
    except S3Conflict:
        pass
    except (S3Unavailable, S3Missing) as exc:
        raise RemoteUnavailable(str(exc)) from None
    if not entries:
        return "none"
    ref = new_head(key, None, own, local, entries, None, REF_SCHEMA)
    try:
        refs.put(objects, key, ref, signing_key)  # signed with its name
    except (S3Unavailable, S3Missing, S3Conflict) as exc:
        raise RemoteUnavailable(str(exc)) from None
    return "reference"


def _remove_junk(objects: S3Objects, key: str, listed: refs.Listed, signing_key: str | None) -> int:
    """A keyed save deletes (best-effort, up to refs.JUNK_DELETES) the references it listed
    that its key did not make: no keyed reader takes them, and a flood of them would cost
    every reader listing pages. A keyless save cannot tell a planted one: it deletes none."""
    if not (signing_key and listed.junk):
        return 0
    return refs.delete(objects, key, listed.junk[: refs.JUNK_DELETES])


def _reused(
    lacking: list[str],
    files: dict[str, Any],
    known: packs.Index,
    orphans: packs.Index,
) -> tuple[packs.Index, list[str]]:
    """Of the files the index lacks: the entries of those already in a pack (the index's,
    this save's, or one this runner sent for a save killed before its head), and the paths
    still to upload."""
    entries: packs.Index = {}
    upload: list[str] = []
    for rel in lacking:
        sha = files[rel]["sha256"]
        found = known.get(sha) or orphans.get(rel)
        if found is not None and found.sha256 == sha:
            entries[rel] = found
        else:
            upload.append(rel)
    return entries, upload


def _head_body(composed: Head) -> bytes:
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
    bad: set[str],
    sent: set[str],
    orphans: packs.Index,
    segments: tuple[SegmentRef, ...] | list[SegmentRef],
    key: str,
) -> set[str]:
    """After the head's (or the reference's) PUT: packs uploaded again, whole, are good from
    now on; the sent records the published `segments` now name are forgotten. The packs
    they name."""
    if bad & sent:
        objects.set_bad(layout, bad - sent)
    named = {p for seg in segments for p in seg.packs}
    objects.forget_sent(layout, key, named & (sent | {e.pack for e in orphans.values()}))
    return named


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


def _usable_index(objects: S3Objects, layout: Layout, head: Head | None, bad: set[str]) -> _Index:
    """The head's index without entries in bad packs, and the segments that could not be
    read (left out of the next head). A segment beyond the readers' bounds (an older writer
    made it) is read up to the repair bounds and written anew within them."""
    if head is None:
        return _Index({}, {}, False)
    merged: packs.Index = {}
    unreadable: dict[str, tuple[int, str]] = {}
    oversize = False
    for seg in head.segments:
        digest = seg.sha256
        try:
            raw = objects.segment_bytes(layout, digest, REPAIR_SEGMENT_OBJECT)
            merged.update(decode_segment(raw, digest, set(seg.packs), REPAIR_SEGMENT_JSON))
        except RemoteCorrupt as exc:
            unreadable[digest] = (seg.files, str(exc))
            continue
        oversize = oversize or not within_bounds(raw)
    usable = {rel: e for rel, e in merged.items() if e.pack not in bad}
    return _Index(usable, unreadable, oversize or len(usable) != len(merged))


def _upload_packs(
    objects: S3Objects,
    layout: Layout,
    key: str,
    upload: list[str],
    files: dict[str, Any],
    signing_key: str | None,
) -> tuple[packs.Index, set[str]]:
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
    entries: packs.Index = {}

    cpu = threading.BoundedSemaphore(usable_cpus())  # building is CPU work: no more at once

    def send(index: str) -> None:
        with objects.spool(layout) as out:  # the pack on disk, never whole in memory
            with cpu:
                name, placed = packs.build_into(scope, chunks[int(index)], files, out)
            objects.bucket.put_file(objects.pack_key(name), out, out.tell())
        objects.record_sent(layout, key, name, placed, signing_key)
        with lock:
            names.add(name)
            entries.update(placed)

    try:
        parallel.run(send, [str(i) for i in range(len(chunks))])
    except (S3Unavailable, S3Missing, S3Conflict) as exc:
        raise RemoteUnavailable(str(exc)) from None
    return entries, names


def _put_segments(objects: S3Objects, entries: packs.Index) -> list[SegmentRef]:
    """Upload `entries` as segments within the readers' bounds; how the head lists them."""
    refs = []
    try:
        for segment in encode_segments(entries):
            ref = segment.ref()
            objects.bucket.put(objects.segment_key(ref.sha256), segment.raw)
            refs.append(ref)
    except (S3Unavailable, S3Missing, S3Conflict) as exc:
        raise RemoteUnavailable(str(exc)) from None
    return refs


def _compose(
    objects: S3Objects,
    key: str,
    current: _Head,
    index: _Index,
    found: refs.Found,
    own: list[SegmentRef],
    entries: packs.Index,
    local: Mapping[str, Any],
    signing_key: str | None,
) -> Head:
    """The next head: the current one's readable segments, then the references' (oldest
    first), then ours, with the merged index's true file count and bytes. Past MAX_SEGMENTS
    more than the index needs, the references' and our entries go into new segments of their
    own; if that is still too many, or the index must be rewritten, all are merged anew."""
    head = current.head
    kept = [s for s in (head.segments if head else ()) if s.sha256 not in index.unreadable]
    added = [s for ref in found.refs for s in ref.body.segments] + own
    later = {**found.files(), **entries}
    merged = {**index.files, **later}
    needed = -(-len(merged) // SEGMENT_FILES)
    segments = _unique(kept + added)
    if len(segments) > MAX_SEGMENTS + needed and len(added) > 1:
        segments = _unique(kept + _put_segments(objects, later))
    if len(segments) > MAX_SEGMENTS + needed or index.rewrite:
        segments = _put_segments(objects, merged)
    return new_head(key, head, segments, local, merged, signing_key)


def _unique(segments: list[SegmentRef]) -> list[SegmentRef]:
    """Segments listed once each (a reference folded twice names the same ones)."""
    by_digest: dict[str, SegmentRef] = {}
    for seg in segments:
        by_digest.setdefault(seg.sha256, seg)
    return list(by_digest.values())


def fold(objects: S3Objects, layout: Layout, key: str, signing_key: str | None) -> dict[str, Any]:
    """Fold every reference of scope `key` that a reader takes into its head (the scheduled
    collection's: invalidate.py), with one conditional PUT, then delete them. Never replaces
    a head it may not extend (with a key: one not signed with it; without: a signed one, nor
    folds signed references: the head would lose its signature). Its counts, and why it did
    not fold."""
    current = _current(objects, key, signing_key)
    found = refs.read(objects, layout, key, signing_key, None, warn=False)
    signed = any(r.body.signed for r in found.refs) or bool(current.head and current.head.signed)
    why = (
        "no reference to fold" if not found.refs
        else f"the head is foreign ({current.replaced})" if current.replaced
        else "signed: FXCACHE_SIGNING_KEY is needed to fold" if signed and not signing_key
        else None
    )  # fmt: skip
    if why:
        return {"folded": 0, "why": why, "left_out": len(found.ignored)}
    index = _usable_index(objects, layout, current.head, objects.bad_packs(layout))
    meta = found.refs[-1].body.to_json()
    composed = _compose(objects, key, current, index, found, [], {}, meta, signing_key)
    try:
        objects.bucket.put(objects.head_key(key), _head_body(composed), if_match=current.etag,
                           if_absent=current.etag is None,
                           content_type="application/json")  # fmt: skip
    except S3Conflict:
        return {"folded": 0, "why": "a save changed the head meanwhile", "left_out": 0}
    except (S3Unavailable, S3Missing) as exc:
        raise RemoteUnavailable(str(exc)) from None
    folded = refs.delete(objects, key, [r.name for r in found.refs])
    return {"folded": folded, "why": None, "left_out": len(found.ignored)}
