"""Restore from S3: read scope `key`'s packs and unpack them into a fresh directory, every
file checked against the (signed) index first, plus a local manifest.

Round trips before the first pack byte: the head, then every segment at once (a runner keeps
copies of segments, which are immutable). Then ranged GETs of about RANGE_BYTES on
FETCH_WORKERS connections; each worker decodes and writes its frames as they arrive, so
file creation overlaps the downloads, and holds one frame stored and one decoded at a time
(store.remote.s3.parallel states the bound).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ci_fxcache.store import manifest as mf
from ci_fxcache.store import overlay, scopes
from ci_fxcache.store.layout import LOCKS, MANIFEST, Layout
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import parallel
from ci_fxcache.store.remote.s3.client import S3Missing, S3TooLarge, S3Unavailable
from ci_fxcache.store.remote.s3.index import check_signature
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import Fetched, RemoteCorrupt, RemoteUnavailable

# Bytes per ranged GET (AWS advises 8-16 MB): enough ranges to keep FETCH_WORKERS busy on a
# 256 MiB scope, few enough that per-request costs stay small.
RANGE_BYTES = 8 * 1024 * 1024


def fetch(
    objects: S3Objects, layout: Layout, key: str, target: Path, signing_key: str | None
) -> Fetched | None:
    """Download scope `key` into `target` (store.remote.tier.RemoteTier.fetch)."""
    head, _etag = objects.read_head(key)
    if head is None:
        return None
    if signing_key:
        check_signature(head, signing_key)
    entries = objects.index(layout, head)
    objects.refuse_remembered(layout, entries)  # a broken copy is downloaded once per runner
    target.mkdir()
    scope_dir = str(target)
    # Every directory first, spread over processes by parent (overlay's measured way):
    # the pack workers then only create files, one open each, no failed open + makedirs.
    overlay.make_parents(scope_dir, entries)
    stats: dict[str, os.stat_result] = {}
    problems = packs.write_empty(entries, scope_dir, stats)
    spans = packs.spans(entries, RANGE_BYTES)
    bad: set[str] = set()
    lock = threading.Lock()
    local = threading.local()

    def read(span: packs.Span) -> None:
        if not hasattr(local, "decoder"):
            local.decoder = packs.Decoder()
        found = _unpack(objects, span, scope_dir, stats, local.decoder)
        if found:
            with lock:
                bad.add(span.pack)
                problems.extend(found)

    try:
        parallel.run(read, spans, parallel.FETCH_WORKERS)
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None
    if bad:
        objects.set_bad(layout, objects.bad_packs(layout) | bad)
        raise RemoteCorrupt(f"{len(bad)} pack(s) missing or damaged", sorted(problems))
    if problems:
        raise RemoteCorrupt("the index is inconsistent", sorted(problems))
    files = {
        rel: {"size": e["size"], "mtime_ns": stats[rel].st_mtime_ns, "sha256": e["sha256"]}
        for rel, e in sorted(entries.items())
    }
    mf.make_read_only(target, stats)
    now = scopes.utc_now()
    manifest = {
        "schema": mf.SCHEMA,
        "scope_key": key,
        "fingerprint": head.get("fingerprint"),
        "torch_paths": head.get("torch_paths") or [],
        "created_at": head.get("created_at") or now,
        "updated_at": head.get("updated_at") or now,
        "last_used_at": now,
        "verification": head.get("verification") or {"references": []},
        "files": files,
        "total_bytes": sum(e["size"] for e in files.values()),
    }
    if signing_key:  # the head was signed with this key and every byte matched it
        mf.sign(manifest, signing_key)
    mf.write_atomic(target / MANIFEST, manifest, layout.root / LOCKS)
    used = {e["pack"] for e in entries.values() if e["size"]}
    return Fetched(len(files), manifest["total_bytes"], {"packs": len(used), "ranges": len(spans)})


def _unpack(
    objects: S3Objects,
    span: packs.Span,
    root: str,
    stats: dict[str, os.stat_result],
    decoder: packs.Decoder,
) -> list[str]:
    """One ranged GET of `span`, its files written under `root` as its frames arrive
    (packs.unpack_span); the problems found."""
    try:
        with objects.bucket.get_range(objects.pack_key(span.pack), span.start, span.end) as read:
            return packs.unpack_span(span, read, root, stats, decoder)
    except S3Missing:
        return [f"missing: pack {span.pack} ({len(span.files)} files)"]
    except S3TooLarge:
        return [f"damaged: pack {span.pack[:12]} answers more bytes than its frames hold"]
