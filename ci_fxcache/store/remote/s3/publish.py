"""Save to S3: upload what the bucket lacks of a committed local scope as new packs and one
new segment, then replace the head.

Only files the index does not list are uploaded, deduplicated by sha256 against every pack
the scope references, as one new pack set and one small segment; the head lists segments,
so a save never re-uploads the whole index (segments are merged into one after
`MAX_SEGMENTS`).

Many writers: a save reads the head with its ETag and replaces it with `If-Match` (or
creates it with `If-None-Match: *`); a lost race re-reads the head and appends its segment
to the winner's.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import parallel
from ci_fxcache.store.remote.s3.client import S3Conflict, S3Missing, S3TooLarge, S3Unavailable
from ci_fxcache.store.remote.s3.index import (
    MAX_HEAD_BYTES,
    encode_head,
    encode_segment,
    new_head,
)
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import RemoteCorrupt, RemoteUnavailable

MAX_SEGMENTS = 16
PUBLISH_ATTEMPTS = 8
# Fault injection for the tests, never set in production (store.save's variable):
# `s3-pause:SECONDS` pauses a publish after its packs and segment, before the head's PUT.
FAULT_ENV = "FXCACHE_TEST_FAULT"


def _fault_pause() -> None:
    fault = os.environ.get(FAULT_ENV, "")
    if fault.startswith("s3-pause:"):
        print("fxcache: test fault: packs uploaded, pausing before the head", flush=True)
        time.sleep(float(fault.split(":", 1)[1]))


def publish(
    objects: S3Objects, layout: Layout, key: str, signing_key: str | None
) -> dict[str, Any]:
    """Upload what the bucket lacks of committed scope `key` (store.remote.tier.RemoteTier)."""
    try:
        local = mf.load(layout.manifest(key))
    except mf.ManifestError as exc:
        return {"published": False, "reason": f"no committed local scope ({exc})"}
    head, etag = _readable_head(objects, key)
    bad = objects.bad_packs(layout)
    remote, dropped = _usable_index(objects, layout, head, bad)
    missing = sorted(
        rel
        for rel, meta in local["files"].items()
        if remote.get(rel, {}).get("sha256") != meta["sha256"]
    )
    if not missing and head is not None and not dropped:
        return {"published": False, "reason": "the bucket has every file", **objects.stats()}
    by_sha = {e["sha256"]: e for e in remote.values()}
    entries: dict[str, dict[str, Any]] = {}
    upload: list[str] = []
    for rel in missing:
        known = by_sha.get(local["files"][rel]["sha256"])
        if known is not None:
            entries[rel] = {**known}
        else:
            upload.append(rel)
    scope = layout.scope(key)
    sent = _upload_packs(objects, scope, upload, local["files"], entries)
    if bad & sent:  # uploaded again, whole: good from now on
        objects.set_bad(layout, bad - sent)
    segment = _put_segment(objects, entries)
    packed = sorted({e["pack"] for e in entries.values()})
    new_seg = {"sha256": segment, "files": len(entries), "packs": packed}
    _fault_pause()
    for _attempt in range(PUBLISH_ATTEMPTS):
        composed = _compose(objects, layout, key, head, dropped, new_seg, local, signing_key)
        try:
            objects.bucket.put(
                objects.head_key(key),
                encode_head(composed),
                if_match=etag,
                if_absent=etag is None,
                content_type="application/json",
            )
            break
        except S3Conflict:
            head, etag = _readable_head(objects, key)  # another save won: merge with it
            _remote, dropped = _usable_index(objects, layout, head, bad)
        except (S3Unavailable, S3Missing) as exc:
            raise RemoteUnavailable(str(exc)) from None
    else:
        raise RemoteUnavailable(f"the head kept changing ({PUBLISH_ATTEMPTS} attempts)")
    return {
        "published": True,
        "files": len(entries),
        "new_packs": len(sent),
        "uploaded_files": len(upload),
        **objects.stats(),
    }


def _readable_head(objects: S3Objects, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """The head to extend: a head that is not ours is replaced (its ETag kept)."""
    try:
        return objects.read_head(key)
    except RemoteCorrupt:
        try:
            got = objects.bucket.get(objects.head_key(key), limit=MAX_HEAD_BYTES)
        except S3TooLarge as exc:
            return None, exc.etag
        except (S3Missing, S3Unavailable) as exc:
            raise RemoteUnavailable(str(exc)) from None
        return None, got[1] if got else None


def _usable_index(
    objects: S3Objects, layout: Layout, head: dict[str, Any] | None, bad: set[str]
) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The head's index without entries in bad packs, and the segments that could not be
    read (dropped from the next head)."""
    if head is None:
        return {}, set()
    merged: dict[str, dict[str, Any]] = {}
    dropped: set[str] = set()
    for seg in head["segments"]:
        try:
            merged.update(objects.segment(layout, seg["sha256"], set(seg["packs"])))
        except RemoteCorrupt:
            dropped.add(seg["sha256"])
    usable = {rel: e for rel, e in merged.items() if e["pack"] not in bad}
    if len(usable) != len(merged):
        dropped.add("")  # entries to override: the head must be rewritten
    return usable, dropped


def _upload_packs(
    objects: S3Objects,
    scope: Path,
    upload: list[str],
    files: dict[str, Any],
    entries: dict[str, dict[str, Any]],
) -> set[str]:
    """Upload `upload` (paths in `scope`) as packs, adding their entries; the packs' names.
    A file that no longer matches its manifest entry is left out (never published)."""
    chunks = list(packs.chunks(upload, files))
    lock = threading.Lock()
    names: set[str] = set()

    def send(index: str) -> None:
        blob, placed = packs.build(scope, chunks[int(index)], files)
        name = packs.sha256_hex(blob)
        objects.bucket.put(objects.pack_key(name), blob)
        with lock:
            names.add(name)
            for rel, e in placed.items():
                entries[rel] = {**e, "pack": name}

    try:
        parallel.run(send, [str(i) for i in range(len(chunks))])
    except (S3Unavailable, S3Missing, S3Conflict) as exc:
        raise RemoteUnavailable(str(exc)) from None
    return names


def _put_segment(objects: S3Objects, entries: dict[str, dict[str, Any]]) -> str:
    raw = encode_segment(entries)
    digest = packs.sha256_hex(raw)
    try:
        objects.bucket.put(objects.segment_key(digest), raw)
    except (S3Unavailable, S3Missing, S3Conflict) as exc:
        raise RemoteUnavailable(str(exc)) from None
    return digest


def _compose(
    objects: S3Objects,
    layout: Layout,
    key: str,
    head: dict[str, Any] | None,
    dropped: set[str],
    new_seg: dict[str, Any],
    local: dict[str, Any],
    signing_key: str | None,
) -> dict[str, Any]:
    """The next head: the current one's readable segments plus ours (all merged into one
    when there are too many, or when entries in bad packs must be overridden)."""
    segments = [s for s in (head or {}).get("segments", []) if s["sha256"] not in dropped]
    segments.append(new_seg)
    if len(segments) > MAX_SEGMENTS or "" in dropped:
        bad = objects.bad_packs(layout)
        merged: dict[str, dict[str, Any]] = {}
        for seg in segments:
            files = objects.segment(layout, seg["sha256"], set(seg["packs"]))
            merged.update({r: e for r, e in files.items() if e["pack"] not in bad})
        digest = _put_segment(objects, merged)
        packed = sorted({e["pack"] for e in merged.values()})
        segments = [{"sha256": digest, "files": len(merged), "packs": packed}]
    return new_head(key, head, segments, local, signing_key)
