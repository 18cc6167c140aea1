"""Restore from S3: download scope `key`'s packs and unpack them into a fresh directory,
every file checked against the (signed) index first, plus a local manifest."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ci_fxcache.store import manifest as mf
from ci_fxcache.store import overlay, scopes
from ci_fxcache.store.layout import LOCKS, MANIFEST, Layout
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.s3 import parallel
from ci_fxcache.store.remote.s3.client import S3Missing, S3Unavailable
from ci_fxcache.store.remote.s3.index import check_signature
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import Fetched, RemoteCorrupt, RemoteUnavailable


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
    groups = packs.groups(entries)
    bad: set[str] = set()
    problems: list[str] = []
    stats: dict[str, os.stat_result] = {}
    try:
        parallel.run(
            lambda pack: _unpack(objects, pack, groups[pack], scope_dir, bad, problems, stats),
            sorted(groups),
        )
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None
    if bad:
        objects.set_bad(layout, objects.bad_packs(layout) | bad)
        raise RemoteCorrupt(f"{len(bad)} pack(s) missing or damaged", problems)
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
    return Fetched(len(files), manifest["total_bytes"], {"packs": len(groups)})


def _unpack(
    objects: S3Objects,
    pack: str,
    files: list[tuple[str, dict[str, Any]]],
    root: str,
    bad: set[str],
    problems: list[str],
    stats: dict[str, os.stat_result],
) -> None:
    """Download one pack and write its files under `root` (packs.extract)."""
    try:
        got = objects.bucket.get(objects.pack_key(pack))
    except S3Missing:
        bad.add(pack)
        problems.append(f"missing: pack {pack} ({len(files)} files)")
        return
    assert got is not None
    altered = packs.extract(pack, got[0], files, root, stats)
    if altered:
        bad.add(pack)
        problems.extend(altered)
