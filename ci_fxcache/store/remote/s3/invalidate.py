"""`fxcache invalidate --s3`: the same policies over the bucket's scopes, then a garbage
collection of packs and segments that no head references.

A scope's last use is the newest LastModified of its head (written by saves) and of its
last-used marker (an empty PUT by every trusted restore). Removing a scope deletes its head
and marker; its packs and segments go with the collection. The collection spares objects
younger than the grace period: a save uploads its packs and segment before the head that
references them, so a save in flight (shorter than the grace) is never broken.

Not covered: a save that started before this run, reused (by sha256) a pack of a scope this
run removes, and publishes after the collection: its head then names a deleted pack, which
the next restore finds missing (quarantine, cold compile, and the save after it uploads the
files again). Never a wrong file.
"""

from __future__ import annotations

import time
from typing import Any

from ci_fxcache.env import scopekey
from ci_fxcache.store.policies import Entry, Policy, select
from ci_fxcache.store.remote.s3.client import S3Missing, S3Unavailable
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import RemoteCorrupt, RemoteUnavailable

DEFAULT_GRACE_S = 24 * 3600.0


def _scopes(tier: S3Objects) -> dict[str, dict[str, float]]:
    """Scope key -> {"head": LastModified, "last-used": LastModified} from one listing."""
    prefix = tier.where.key("scopes") + "/"
    found: dict[str, dict[str, float]] = {}
    for item in tier.bucket.listing(prefix):
        key, _, name = item["Key"][len(prefix) :].partition("/")
        if name in ("head.json", "last-used"):
            found.setdefault(key, {})[name] = item["LastModified"]
    return found


def run(
    tier: S3Objects,
    policy: Policy,
    dry_run: bool,
    grace_s: float = DEFAULT_GRACE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """Apply the policies to the bucket's scopes and collect unreferenced objects; rows in
    the shape of the other stores', plus the collection's counts."""
    now = time.time() if now is None else now
    tier.start()
    try:
        return _run(tier, policy, dry_run, grace_s, now)
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None


def _run(
    tier: S3Objects, policy: Policy, dry_run: bool, grace_s: float, now: float
) -> dict[str, Any]:
    entries: list[Entry] = []
    heads: dict[str, dict[str, Any]] = {}
    broken: list[str] = []
    for key, times in sorted(_scopes(tier).items()):
        parsed = scopekey.parse(key)
        if parsed is None or "head.json" not in times:
            continue  # not ours, or a marker without a head (its scope was removed)
        try:
            head, _etag = tier.read_head(key)
        except RemoteCorrupt:
            broken.append(key)  # referenced objects unknown: nothing is collected below
            continue
        if head is None:
            continue
        heads[key] = head
        size = head.get("total_bytes")
        entries.append(
            Entry(
                name=key,
                key=parsed,
                last_used=max(times.values()),
                size=size if isinstance(size, int) and size >= 0 else 0,
                ident=key,
            )
        )
    rows = []
    for entry in select(entries, policy, now):
        action = "would remove" if dry_run else "removed"
        if not dry_run:
            tier.bucket.delete(tier.head_key(entry.name))
            tier.bucket.delete(tier.last_used_key(entry.name))
        heads.pop(entry.name)
        rows.append(
            {
                "store": "s3",
                "scope": entry.name,
                "bytes": entry.size,
                "last_used": entry.last_used,
                "reasons": entry.reasons,
                "action": action,
            }
        )
    gc: dict[str, Any] = {
        "objects_removed": 0,
        "bytes_removed": 0,
        "kept_in_grace": 0,
        "skipped": None,
    }
    if broken:
        gc["skipped"] = f"{len(broken)} head(s) unreadable, so what they reference is unknown"
        return {"rows": rows, "gc": gc}
    referenced = {
        name for head in heads.values() for seg in head["segments"] for name in (
            tier.segment_key(seg["sha256"]), *(tier.pack_key(p) for p in seg["packs"])
        )
    }  # fmt: skip
    for kind in ("segments", "packs"):
        for item in tier.bucket.listing(tier.where.key(kind) + "/"):
            if item["Key"] in referenced:
                continue
            if now - item["LastModified"] < grace_s:
                gc["kept_in_grace"] += 1
                continue
            if not dry_run:
                try:
                    tier.bucket.delete(item["Key"])
                except S3Missing:
                    continue
            gc["objects_removed"] += 1
            gc["bytes_removed"] += item["Size"]
    return {"rows": rows, "gc": gc}
