"""`fxcache invalidate --s3`: an inventory of the bucket's scopes, the same policies over them,
then a garbage collection of packs and segments that no head references.

A scope's last use is the newest LastModified of its head (written by saves), its references
(refs.py) and its last-used marker (an empty PUT by every trusted restore); its size in the
bucket is the bytes of the packs and segments its head and references name (`--max-size`
counts these). Removing a scope deletes its head, references and marker; its packs and
segments go with the collection, unless a kept scope names them too (packs are named by
content, so scopes can share them): what a run frees is what the collection deletes, never
the removed scopes' sizes added up.

With the signing key the policies count only what the key signed (the head, the references
whose name and body it made): a scope nothing of which it signed is neither counted nor
removed, its bytes and last use are those of its signed objects (and its last-used marker),
and every reference the key did not make is deleted; so planted scopes and references never
make `--max-size` or `--keep-latest` remove a real scope. Without the key, over a bucket with
signed scopes, the run does what it safely can and says what needs the key (`gc.needs_key`).

Before the collection, each kept scope's references are folded into its head
(publish.fold: one conditional PUT; signed ones only with the signing key) and deleted; a
reference older than the grace that no reader would serve (unreadable, not signed with the
key, or naming an object that is gone) is dropped instead. The objects every remaining
reference names are kept like the head's.

The collection spares objects younger than the grace period (at least `MIN_GRACE_S`): a save
uploads its packs and segment before the head that references them, and may reuse packs it
uploaded earlier without a head (publish.ORPHAN_REUSE_S), so a save in flight (bounded by
deadline.MAX_S) is never broken. A head that cannot be read does not stop the collection:
every object whose name (a sha256) appears anywhere in its bytes is kept, the rest is
collected, and the head is reported.

Versioned buckets: a delete there only adds a delete marker, and every save's head and every
re-uploaded pack leaves the replaced version behind, all still stored. So when the bucket has
versioning on (or suspended), the inventory counts the noncurrent versions and delete markers
under the prefix and their bytes (`bucket.noncurrent_*`), and the collection deletes them by
version id (`gc.versions_removed`): fxcache never reads a version that is not the latest.
Older versions of a key are deleted before its delete marker, so no deleted object comes back.
That needs s3:ListBucketVersions, s3:GetBucketVersioning and s3:DeleteObjectVersion; without
them the inventory says `versioning: unknown` and a lifecycle rule must do it (docs/store.md).

Not covered: a save that started before this run, reused (by sha256) a pack of a scope this
run removes, and publishes after the collection: its head then names a deleted pack, which
the next restore finds missing (quarantine, cold compile, and the save after it uploads the
files again). Never a wrong file.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci_fxcache.env import scopekey
from ci_fxcache.errors import CheckFailed, UsageError
from ci_fxcache.store.invalidate import InvalidationResult
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.policies import Entry, Policy, select
from ci_fxcache.store.remote.s3 import parallel, publish, refs
from ci_fxcache.store.remote.s3.client import S3Missing, S3TooLarge, S3Unavailable
from ci_fxcache.store.remote.s3.deadline import MAX_S
from ci_fxcache.store.remote.s3.index import (
    REF_SCHEMA,
    Head,
    parse_head,
    signature_problem,
)
from ci_fxcache.store.remote.s3.objects import HeadTooLarge, S3Objects
from ci_fxcache.store.remote.s3.publish import ORPHAN_REUSE_S
from ci_fxcache.store.remote.tier import RemoteCorrupt, RemoteUnavailable

DEFAULT_GRACE_S = 24 * 3600.0
# The longest a save can take (its time bound) plus the age of a pack it may reuse, with an
# hour for clocks that disagree: a shorter grace could delete a pack a save is about to name.
MIN_GRACE_S = MAX_S + ORPHAN_REUSE_S + 3600.0
_SHA256 = re.compile(rb"[0-9a-f]{64}")
# A keyed run's word on a scope nothing of which its key signed: neither counted by the
# policies nor removed by them (its objects are kept like any head's).
NOT_COUNTED = "not signed with the key: not counted, not removed"
# A keyless run over a bucket with signed scopes says what only the key can do.
NEEDS_KEY = (
    "signed scopes: without FXCACHE_SIGNING_KEY their references are not folded, references "
    "the key did not make are removed only when older than the grace and of no reference "
    "format, and the policies count every scope and size anyone wrote (planted ones too)"
)


@dataclass
class _Scope:
    """One scope of the bucket as the inventory sees it."""

    key: str
    parsed: scopekey.ParsedKey
    last_used: float
    head: Head | None = None
    problem: str | None = None  # why the head could not be read
    names: set[str] = field(default_factory=set)  # object keys its head and references name
    refs: dict[str, float] = field(default_factory=dict)  # reference name -> LastModified
    # References no reader serves (with a key: at once; else once older than the grace) or
    # whose objects are gone.
    dead: set[str] = field(default_factory=set)
    times: dict[str, float] = field(default_factory=dict)  # head.json, last-used -> LastModified
    # With a signing key: the object keys and LastModified of what it signed (the head, the
    # references); the policies count only these.
    signed_names: set[str] = field(default_factory=set)
    signed_times: list[float] = field(default_factory=list)
    signed: bool = False  # anything of the scope is signed (with the key: with that key)


def run(
    tier: S3Objects,
    policy: Policy,
    dry_run: bool,
    grace_s: float = DEFAULT_GRACE_S,
    now: float | None = None,
    signing_key: str | None = None,
) -> dict[str, Any]:
    """Inventory the bucket's scopes, apply the policies, collect unreferenced objects: rows
    in the shape of the other stores', the inventory, the bucket's totals, the collection's
    counts. Within one time bound (deadline.py); RemoteUnavailable when the bucket cannot be
    listed or its heads read."""
    now = time.time() if now is None else now
    tier.start()
    try:
        return _run(tier, policy, dry_run, grace_s, now, signing_key)
    except S3Unavailable as exc:
        raise RemoteUnavailable(str(exc)) from None


class Bucket:
    """`fxcache invalidate --s3`: the bucket's scopes, then its unreferenced objects (the
    store invalidation shape: store/invalidate.py)."""

    def __init__(
        self, tier: S3Objects, grace_s: float = DEFAULT_GRACE_S, signing_key: str | None = None
    ) -> None:
        if grace_s < MIN_GRACE_S:
            raise UsageError(
                f"--gc-grace {grace_s / 3600:g}h: at least {MIN_GRACE_S / 3600:g}h (a save in "
                "flight uploads its packs before the head that names them)"
            )
        self.tier, self.grace_s, self.signing_key = tier, grace_s, signing_key

    def invalidate(self, policy: Policy, dry_run: bool) -> InvalidationResult:
        """`run`: the rows, and the inventory as the result's `s3`; CheckFailed (exit 1) when
        the bucket cannot be used. A collection that stopped short fails the run too."""
        try:
            done = run(self.tier, policy, dry_run, self.grace_s, signing_key=self.signing_key)
        except RemoteUnavailable as exc:  # the network, not the user's input
            raise CheckFailed(f"S3 {self.tier.describe()}: {exc}") from exc
        inventory = {"url": self.tier.describe(), "dry_run": dry_run, "gc": done["gc"],
                     "scopes": done["scopes"], "bucket": done["bucket"]}  # fmt: skip
        return InvalidationResult(done["rows"], {"s3": inventory}, "error" in done["gc"])


def _listing(tier: S3Objects, kind: str) -> list[dict[str, Any]]:
    return tier.bucket.listing(tier.where.key(kind) + "/")


def _scopes(tier: S3Objects, listed: list[dict[str, Any]]) -> list[_Scope]:
    """Our scopes that have a head or references, from the listing of `scopes/` (foreign
    keys and markers alone, whose scope was removed, are left alone)."""
    prefix = tier.where.key("scopes") + "/"
    times: dict[str, dict[str, float]] = {}
    found_refs: dict[str, dict[str, float]] = {}
    for item in listed:
        key, _, name = item["Key"][len(prefix) :].partition("/")
        if name in ("head.json", "last-used"):
            times.setdefault(key, {})[name] = item["LastModified"]
        elif name.startswith("refs/"):
            found_refs.setdefault(key, {})[name[len("refs/") :]] = item["LastModified"]
    found = []
    for key in sorted(set(times) | set(found_refs)):
        seen, own = times.get(key, {}), found_refs.get(key, {})
        parsed = scopekey.parse(key)
        if parsed is not None and ("head.json" in seen or own):
            last = max([*seen.values(), *own.values()])
            found.append(_Scope(key, parsed, last, refs=own, times=seen))
    return found


def _named(tier: S3Objects, doc: Head) -> set[str]:
    """The object keys a head or reference names."""
    names = {tier.segment_key(seg.sha256) for seg in doc.segments}
    return names | {tier.pack_key(p) for seg in doc.segments for p in seg.packs}


def _mentioned(tier: S3Objects, body: bytes) -> set[str]:
    """Every object whose sha256 appears in an unreadable head's or reference's bytes."""
    digests = {m.decode() for m in _SHA256.findall(body)}
    return {tier.segment_key(d) for d in digests} | {tier.pack_key(d) for d in digests}


def _read_heads(tier: S3Objects, scopes: list[_Scope], signing_key: str | None) -> None:
    """Each scope's head and the object keys it names; an unreadable head names every
    object whose sha256 appears in its bytes. Whether it is signed (with a key: with that
    key, and then what it names counts as signed)."""
    lock = threading.Lock()
    by_key = {s.key: s for s in scopes}

    def read(key: str) -> None:
        scope = by_key[key]
        try:
            got = tier.head_object(key)
        except HeadTooLarge as exc:  # not read at all: it names nothing we can know
            scope.problem = str(exc)
            return
        if got is None:
            return  # removed meanwhile (or references only): nothing to name
        body = got[0]
        try:
            head = parse_head(body, key)
            with lock:
                scope.head, scope.names = head, scope.names | _named(tier, head)
                if signing_key is None:
                    scope.signed = scope.signed or head.signed
                elif signature_problem(head, signing_key) is None:
                    scope.signed = True
                    scope.signed_names |= _named(tier, head)
                    scope.signed_times.append(scope.times["head.json"])
        except RemoteCorrupt as exc:
            with lock:
                scope.problem, scope.names = str(exc), scope.names | _mentioned(tier, body)

    parallel.run(read, sorted(by_key))


def _read_refs(
    tier: S3Objects,
    scopes: list[_Scope],
    objects: dict[str, dict[str, Any]],
    signing_key: str | None,
    old: float,
) -> None:
    """What each scope's references name. Dead (no reader serves it, and it keeps nothing):
    with a key, one whose name or signature that key did not make, at once; one older than
    `old` (the grace's edge) that is unreadable, of no reference name's format, or names an
    object that is gone."""
    lock = threading.Lock()
    work = [(s, name) for s in scopes for name in sorted(s.refs)]

    def read(item: tuple[_Scope, str]) -> None:
        scope, name = item
        if not refs.taken(name, scope.key, signing_key):  # no GET: a flood costs no reads
            with lock:
                if signing_key or scope.refs[name] < old:
                    scope.dead.add(name)
            return
        try:
            got = tier.bucket.get(tier.where.key("scopes", scope.key, "refs", name),
                                  limit=refs.MAX_REF_BYTES)  # fmt: skip
        except (S3Missing, S3TooLarge):
            got = None
        body = got[0] if got else b""
        try:
            ref = parse_head(body, scope.key, REF_SCHEMA)
            named = _named(tier, ref)
            problem = bool(signing_key and refs.signature_problem(ref, name, signing_key))
            signed = ref.signed and not problem
        except RemoteCorrupt:
            named, problem, signed = _mentioned(tier, body), True, False
        with lock:
            if (signing_key and problem) or (
                scope.refs[name] < old and (problem or not named <= objects.keys())
            ):
                scope.dead.add(name)
                return
            scope.names |= named
            scope.signed = scope.signed or signed
            if signing_key:
                scope.signed_names |= named
                scope.signed_times.append(scope.refs[name])

    parallel.run(read, work)


def _run(
    tier: S3Objects,
    policy: Policy,
    dry_run: bool,
    grace_s: float,
    now: float,
    signing_key: str | None,
) -> dict[str, Any]:
    scopes = _scopes(tier, _listing(tier, "scopes"))
    objects = {item["Key"]: item for kind in ("segments", "packs") for item in _listing(tier, kind)}
    _read_heads(tier, scopes, signing_key)
    _read_refs(tier, scopes, objects, signing_key, now - grace_s)
    stored, entries = _counted(scopes, objects, signing_key)
    selected = {e.name: e for e in select(entries, policy, now)}
    action = "would remove" if dry_run else "removed"
    rows = []
    for entry in selected.values():
        if not dry_run:
            _remove(tier, next(s for s in scopes if s.key == entry.name))
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
    kept = [s for s in scopes if s.key not in selected]
    folds = _fold(tier, kept, dry_run, signing_key)
    gc = _collect(tier, objects, {n for s in kept for n in s.names}, dry_run, grace_s, now)
    gc.update(folds)
    if not signing_key and any(s.signed for s in scopes):
        gc["needs_key"] = NEEDS_KEY
    versions = _versions(tier, gc, dry_run)
    gc["unreadable"] = [
        {"scope": s.key, "problem": s.problem, "kept_objects": len(s.names & objects.keys())}
        for s in scopes
        if s.problem is not None and s.problem != NOT_COUNTED
    ]
    return {
        "rows": rows,
        "gc": gc,
        "scopes": [_inventory_row(s, stored[s.key], selected.get(s.key), action) for s in scopes],
        "bucket": {
            "scopes": len(scopes),
            "objects": len(objects),
            "bytes": sum(item["Size"] for item in objects.values()),
            "references": sum(len(s.refs) for s in scopes),
            **versions,
        },
    }


def _counted(
    scopes: list[_Scope], objects: dict[str, dict[str, Any]], signing_key: str | None
) -> tuple[dict[str, int], list[Entry]]:
    """Each scope's bytes in the bucket, and the entries the policies count. With a key,
    only what the key signed counts (its objects' bytes, their times and the marker's), and
    a scope nothing of which it signed is not counted: never what anyone planted."""
    if signing_key:
        for s in scopes:
            s.last_used = max([*s.signed_times, s.times.get("last-used", 0.0)])
            if not s.signed and s.problem is None:
                s.problem = NOT_COUNTED
    stored = {
        s.key: sum(objects[n]["Size"] for n in (s.signed_names if signing_key else s.names)
                   if n in objects)
        for s in scopes
    }  # fmt: skip
    entries = [
        Entry(name=s.key, key=s.parsed, last_used=s.last_used, size=stored[s.key], ident=s.key)
        for s in scopes
        if s.signed or not signing_key
    ]
    return stored, entries


def _remove(tier: S3Objects, scope: _Scope) -> None:
    """Delete a removed scope's head, marker and references."""
    tier.bucket.delete(tier.head_key(scope.key))
    tier.bucket.delete(tier.last_used_key(scope.key))
    refs.delete(tier, scope.key, sorted(scope.refs))


def _fold(
    tier: S3Objects, kept: list[_Scope], dry_run: bool, signing_key: str | None
) -> dict[str, Any]:
    """Delete the kept scopes' dead references, then fold the others into their heads
    (publish.fold); the counts, and why a scope's references stay."""
    dead = [(s, n) for s in kept for n in sorted(s.dead)]
    found: dict[str, Any] = {"refs_dropped": len(dead), "refs_folded": 0, "refs_unfolded": {}}
    if dry_run:
        return found
    for scope in {s.key: s for s, _ in dead}.values():
        refs.delete(tier, scope.key, sorted(scope.dead))
    with tempfile.TemporaryDirectory(prefix="fxcache-gc-") as where:
        layout = Layout(Path(where))  # copies of segments, for this run only
        for scope in kept:
            if set(scope.refs) - scope.dead:
                done = publish.fold(tier, layout, scope.key, signing_key)
                found["refs_folded"] += done["folded"]
                if done["why"] and done["why"] != "no reference to fold":
                    found["refs_unfolded"][scope.key] = done["why"]
    return found


def _versions(tier: S3Objects, gc: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    """With versioning on or suspended: what noncurrent versions and delete markers the
    prefix holds (the inventory's), then (unless a dry run) delete them by version id, each
    key's delete marker after its older versions; the collection's counts go into `gc`."""
    status = tier.bucket.versioning()
    if status not in ("Enabled", "Suspended"):
        return {"versioning": status}
    listed = [
        v
        for kind in ("scopes", "segments", "packs")
        for v in tier.bucket.versions(tier.where.key(kind) + "/")
    ]
    old = [v for v in listed if not v["Latest"]]
    markers = [v for v in listed if v["Latest"] and v["Marker"]]
    found = {
        "versioning": status,
        "noncurrent_versions": sum(1 for v in old if not v["Marker"]),
        "noncurrent_bytes": sum(v["Size"] for v in old),
        "delete_markers": sum(1 for v in listed if v["Marker"]),
    }
    if dry_run:
        gc.update(versions_removed=len(old) + len(markers),
                  version_bytes_removed=found["noncurrent_bytes"])  # fmt: skip
        return found
    gc.update(versions_removed=0, version_bytes_removed=0)
    lock = threading.Lock()

    def delete(version: dict[str, Any]) -> None:
        tier.bucket.delete_version(version["Key"], version["VersionId"])
        with lock:
            gc["versions_removed"] += 1
            gc["version_bytes_removed"] += version["Size"]

    try:
        parallel.run(delete, old)
        parallel.run(delete, markers)
    except S3Unavailable as exc:
        gc["error"] = f"{gc.get('error', '')}; versions not all removed: {exc}".lstrip("; ")
    return found


def _inventory_row(
    scope: _Scope, stored: int, selected: Entry | None, action: str
) -> dict[str, Any]:
    head = scope.head
    return {
        "scope": scope.key,
        "torch": scope.parsed.torch,
        "accel": scope.parsed.accel,
        "archs": list(scope.parsed.archs),
        "pool": scope.parsed.runner_pool,
        "files": head.files if head else None,
        "bytes": head.total_bytes if head else None,
        "stored_bytes": stored,
        "last_used": scope.last_used,
        "action": action if selected is not None else "keep",
        "reasons": selected.reasons if selected is not None else [],
        "problem": scope.problem,
    }


def _collect(
    tier: S3Objects,
    objects: dict[str, dict[str, Any]],
    referenced: set[str],
    dry_run: bool,
    grace_s: float,
    now: float,
) -> dict[str, Any]:
    """Delete the objects no kept head names, older than the grace period."""
    gc: dict[str, Any] = {"objects_removed": 0, "bytes_removed": 0, "kept_in_grace": 0}
    doomed = []
    for key, item in sorted(objects.items()):
        if key in referenced:
            continue
        if now - item["LastModified"] < grace_s:
            gc["kept_in_grace"] += 1
            continue
        doomed.append(key)
    done = doomed if dry_run else []
    if not dry_run:
        lock = threading.Lock()

        def delete(key: str) -> None:
            tier.bucket.delete(key)
            with lock:
                done.append(key)

        try:
            parallel.run(delete, doomed)
        except S3Unavailable as exc:
            gc["error"] = f"{len(doomed) - len(done)} object(s) not removed: {exc}"
    gc["objects_removed"] = len(done)
    gc["bytes_removed"] = sum(objects[k]["Size"] for k in done)
    return gc
