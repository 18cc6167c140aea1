"""Restore from S3: read scope `key`'s packs and unpack them into a fresh directory, every
file checked against the (signed) index first, plus a local manifest.

Round trips before the first pack byte: the head, the listing of its references
(refs.py), then every reference and segment at once (a runner keeps
copies of segments, which are immutable). Then ranged GETs of about RANGE_BYTES on
FETCH_WORKERS connections; each worker decodes and writes its frames as they arrive, so
file and directory creation overlap the downloads. Decoding, hashing and writing take one of
`usable_cpus()` slots: more connections than CPUs keep the link busy, and no more threads
than CPUs compete for them (store.remote.s3.parallel states the memory bound).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ci_fxcache.env.cpus import usable_cpus
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes, seal
from ci_fxcache.store.layout import CACHE_DIRS, LOCKS, MANIFEST, Layout
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import parallel, refs
from ci_fxcache.store.remote.s3.client import S3Missing, S3TooLarge, S3Unavailable
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import Fetched, RemoteCorrupt, RemoteUnavailable
from ci_fxcache.store.stat_batch import Dirs

# Bytes per ranged GET (AWS advises 8-16 MB): enough ranges to keep FETCH_WORKERS busy on a
# 256 MiB scope, few enough that per-request costs stay small.
RANGE_BYTES = 8 * 1024 * 1024


def fetch(
    objects: S3Objects,
    layout: Layout,
    key: str,
    target: Path,
    signing_key: str | None,
    found: Callable[[str], None] | None = None,
) -> Fetched | None:
    """Download scope `key` into `target` (store.remote.tier.RemoteTier.fetch); `found(key)`
    is called once the scope is known to be there, before its packs are read."""
    # A restore allocates ~10 objects per file and frees few: the collector would walk every
    # live object (the index's entries included) many times over, for no garbage.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _fetch(objects, layout, key, target, signing_key, found)
    finally:
        if collecting:
            gc.enable()


def _fetch(
    objects: S3Objects,
    layout: Layout,
    key: str,
    target: Path,
    signing_key: str | None,
    found: Callable[[str], None] | None,
) -> Fetched | None:
    head, entries = refs.view(objects, layout, key, signing_key)  # the head and its references
    if head is None:
        return None
    if found is not None:
        found(key)
    objects.refuse_remembered(layout, entries)  # a broken copy is downloaded once per runner
    target.mkdir()
    tree = packs.Tree(str(target))
    stats: dict[str, os.stat_result] = {}
    problems = packs.write_empty(entries, tree, stats)
    spans = packs.spans(entries, RANGE_BYTES)
    bad: set[str] = set()
    lock = threading.Lock()
    local = threading.local()
    cpu = threading.BoundedSemaphore(usable_cpus())
    decoded: list[bytearray] = []  # a frame's worth per CPU slot (packs.unpack_span)

    def read(span: packs.Span) -> None:
        if not hasattr(local, "decoder"):
            local.decoder = packs.Decoder()
        found = _unpack(objects, span, tree, stats, (local.decoder, cpu, decoded))
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
        rel: {"size": e.size, "mtime_ns": stats[rel].st_mtime_ns, "sha256": e.sha256}
        for rel, e in sorted(entries.items())
    }
    mf.make_read_only(target, stats)
    now = scopes.utc_now()
    manifest: dict[str, Any] = {
        "schema": mf.SCHEMA,
        "scope_key": key,
        "fingerprint": head.fingerprint,
        "torch_paths": list(head.torch_paths),
        "created_at": head.created_at or now,
        "updated_at": head.updated_at or now,
        "last_used_at": now,
        "verification": head.verification,
        "files": files,
        "total_bytes": sum(e["size"] for e in files.values()),
    }
    if signing_key:  # the head was signed with this key and every byte matched it
        mf.sign(manifest, signing_key)
    digest = mf.write_atomic(target / MANIFEST, manifest, layout.root / LOCKS)
    for name in CACHE_DIRS:  # as the local restore makes them: the seal covers every one
        tree.make(name)
    # Every directory and file here was made by this fetch, and each file checked as written:
    # the local restore need not list them again (store.seal; a full check ignores seals).
    made = seal.Seal(Dirs.of(tree.stamps()), mf.listed(manifest), bool(signing_key))
    used = {e.pack for e in entries.values() if e.size}
    detail = {"packs": len(used), "ranges": len(spans)}
    return Fetched(len(files), manifest["total_bytes"], detail, packs.written(digest, made, stats))


def _unpack(
    objects: S3Objects,
    span: packs.Span,
    tree: packs.Tree,
    stats: dict[str, os.stat_result],
    work: tuple[packs.Decoder, threading.BoundedSemaphore, list[bytearray]],
) -> list[str]:
    """One ranged GET of `span`, its files written into `tree` as its frames arrive
    (packs.unpack_span with this thread's decoder, the CPU slots and their buffers); the
    problems found."""
    decoder, cpu, decoded = work
    try:
        with objects.bucket.get_range(objects.pack_key(span.pack), span.start, span.end) as read:
            return packs.unpack_span(span, read, tree, stats, decoder, cpu, decoded, named=True)
    except S3Missing:
        return [f"missing: pack {span.pack} ({len(span.files)} files)"]
    except S3TooLarge:
        return [f"damaged: pack {span.pack[:12]} answers more bytes than its frames hold"]
