"""`store: s3`: the remote tier in an S3-compatible bucket, as packs of files plus an index.

```
PREFIX/scopes/<scope-key>/head.json  the scope's remote manifest: its index segments (sha256,
                                     file count, packs each references), fingerprint, times,
                                     optional HMAC; replaced only by a conditional PUT
PREFIX/scopes/<scope-key>/last-used  empty; its LastModified is the scope's last use
PREFIX/segments/<sha256>             immutable gzip JSON: path -> sha256, size, pack, offset
PREFIX/packs/<sha256>                immutable: many files' bytes, back to back
```

Why packs, not one object per file (measured, docs/store.md): a scope is ~18,000 files; one
GET per file is ~18,000 requests per restore, and per-request cost, not bandwidth, dominates.
Packs of ~32 MiB make a 1 GiB restore ~32 parallel GETs. A save uploads only files the
index does not list, deduplicated by sha256 against every pack the scope references, as one
new pack set and one small segment; the head lists segments, so a save never re-uploads the
whole index (segments are merged into one after `MAX_SEGMENTS`).

Many writers: a save reads the head with its ETag and replaces it with `If-Match` (or creates
it with `If-None-Match: *`); a lost race re-reads the head and appends its segment to the
winner's. Signing covers the head, and the head names each segment by sha256, each segment
each file by sha256: a restore with the key refuses an unsigned or wrongly signed head.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from ci_fxcache import atomic_write
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import overlay, scopes
from ci_fxcache.store.layout import LOCKS, MANIFEST, Layout
from ci_fxcache.store.remote.s3.client import Bucket, Location, S3Conflict, S3Missing, S3Unavailable
from ci_fxcache.store.remote.tier import REMOTE_DIR, Fetched, RemoteCorrupt, RemoteUnavailable

HEAD_SCHEMA = "fxcache-s3-head/1"
SEGMENT_SCHEMA = "fxcache-s3-segment/1"
PACK_BYTES = 32 * 1024 * 1024
MAX_SEGMENTS = 16
WORKERS = 8
# Fetched files are created as manifest.make_read_only leaves a committed file (read-only,
# readable by all), so the fetch needs no chmod pass; exclusive: nothing is written through
# a file or link already there.
_FILE_MODE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PUBLISH_ATTEMPTS = 8
# Fault injection for the tests, never set in production (store.save's variable):
# `s3-pause:SECONDS` pauses a publish after its packs and segment, before the head's PUT.
FAULT_ENV = "FXCACHE_TEST_FAULT"


def _fault_pause() -> None:
    fault = os.environ.get(FAULT_ENV, "")
    if fault.startswith("s3-pause:"):
        print("fxcache: test fault: packs uploaded, pausing before the head", flush=True)
        time.sleep(float(fault.split(":", 1)[1]))


def _digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def head_problem(head: object, key: str) -> str | None:
    """Why a parsed head is not one a save of scope `key` wrote, or None."""
    if not isinstance(head, dict) or head.get("schema") != HEAD_SCHEMA:
        return "not an fxcache S3 head"
    if head.get("scope_key") != key:
        return "head belongs to another scope"
    segments = head.get("segments")
    if not isinstance(segments, list):
        return "head has no segment list"
    for seg in segments:
        if not (
            isinstance(seg, dict)
            and mf.is_digest(seg.get("sha256"))
            and isinstance(seg.get("packs"), list)
            and all(mf.is_digest(p) for p in seg["packs"])
        ):
            return "head lists a malformed segment"
    if head.get("fingerprint") is not None and not isinstance(head.get("fingerprint"), dict):
        return "head fingerprint is malformed"
    paths = head.get("torch_paths", [])
    if not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)):
        return "head torch_paths is malformed"
    if not all(isinstance(head.get(k, ""), str) for k in ("created_at", "updated_at")):
        return "head times are malformed"
    verification = head.get("verification") or {"references": []}
    refs = verification.get("references") if isinstance(verification, dict) else None
    if not (isinstance(refs, list) and all(isinstance(r, str) for r in refs)):
        return "head verification is malformed"
    return None


def _segment_problem(data: object, packs: set[str]) -> str | None:
    if not isinstance(data, dict) or data.get("schema") != SEGMENT_SCHEMA:
        return "not an fxcache S3 segment"
    files = data.get("files")
    if not isinstance(files, dict):
        return "segment has no file list"
    for rel, e in files.items():
        if not (
            mf.safe_relpath(rel)
            and isinstance(e, dict)
            and mf.is_digest(e.get("sha256"))
            and mf.is_count(e.get("size"))
            and mf.is_count(e.get("offset"))
            and e.get("pack") in packs
        ):
            return f"segment entry {str(rel)[:200]!r} is malformed"
    return None


def pack_groups(entries: dict[str, dict[str, Any]]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Index entries by pack, each pack's files in offset order."""
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for rel, e in entries.items():
        groups.setdefault(e["pack"], []).append((rel, e))
    for files in groups.values():
        files.sort(key=lambda item: item[1]["offset"])
    return groups


class S3Tier:
    """The S3 backend of the remote tier (store.remote.tier.RemoteTier)."""

    name = "s3"

    def __init__(self, where: Location, bucket: Bucket | None = None) -> None:
        self.where = where
        self._bucket = bucket

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def bucket(self) -> Bucket:
        """The client, made on first use (boto3 is imported only by S3 operations)."""
        if self._bucket is None:
            try:
                self._bucket = Bucket(self.where)
            except S3Unavailable as exc:
                raise RemoteUnavailable(str(exc)) from None
        return self._bucket

    def describe(self) -> str:
        """`s3://BUCKET/PREFIX`."""
        return self.where.url()

    def head_key(self, key: str) -> str:
        """Object key of scope `key`'s head."""
        return self.where.key("scopes", key, "head.json")

    def last_used_key(self, key: str) -> str:
        """Object key of scope `key`'s last-used marker."""
        return self.where.key("scopes", key, "last-used")

    def segment_key(self, digest: str) -> str:
        """Object key of an index segment."""
        return self.where.key("segments", digest)

    def pack_key(self, digest: str) -> str:
        """Object key of a pack."""
        return self.where.key("packs", digest)

    def stats(self) -> dict[str, Any]:
        """Requests by kind and bytes moved so far by this tier's client."""
        if self._bucket is None:
            return {"requests": {}, "uploaded_bytes": 0, "downloaded_bytes": 0}
        b = self._bucket
        return {
            "requests": dict(b.requests),
            "uploaded_bytes": b.sent_bytes,
            "downloaded_bytes": b.received_bytes,
        }

    def _local(self, layout: Layout) -> Path:
        """What this runner keeps about the bucket (immutable segments, bad packs)."""
        ident = _digest(self.describe().encode())[:16]
        return layout.root / REMOTE_DIR / f"s3-{ident}"

    def _bad_packs(self, layout: Layout) -> set[str]:
        try:
            data = json.loads((self._local(layout) / "bad-packs.json").read_text())
        except (OSError, ValueError):
            return set()
        return {p for p in data if mf.is_digest(p)} if isinstance(data, list) else set()

    def _set_bad(self, layout: Layout, packs: set[str]) -> None:
        """Record the packs found missing or damaged: never used from the bucket again until
        this runner uploads that pack itself (a pack's name is its content's sha256)."""
        where = self._local(layout)
        where.mkdir(parents=True, exist_ok=True)
        text = json.dumps(sorted(packs)) + "\n"
        atomic_write.write_text(where / "bad-packs.json", text, layout.root / LOCKS)

    # -- reading the index -------------------------------------------------------------------
    def read_head(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """(head, ETag) of scope `key`, (None, None) when it has none; RemoteCorrupt when the
        head is not one a save wrote."""
        try:
            got = self.bucket.get(self.head_key(key))
        except S3Missing:
            return None, None
        except S3Unavailable as exc:
            raise RemoteUnavailable(str(exc)) from None
        assert got is not None
        body, etag = got
        try:
            head = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise RemoteCorrupt("remote head is not JSON") from None
        problem = head_problem(head, key)
        if problem:
            raise RemoteCorrupt(problem)
        return head, etag

    def _segment(self, layout: Layout, digest: str, packs: set[str]) -> dict[str, Any]:
        """The files of segment `digest` (checked against its name), from this runner's copy
        or the bucket."""
        copy = self._local(layout) / "segments" / digest
        try:
            raw = copy.read_bytes()
        except OSError:
            raw = b""
        if _digest(raw) != digest:
            try:
                got = self.bucket.get(self.segment_key(digest))
            except S3Missing:
                raise RemoteCorrupt(f"index segment {digest[:12]} is missing") from None
            except S3Unavailable as exc:
                raise RemoteUnavailable(str(exc)) from None
            assert got is not None
            raw = got[0]
            if _digest(raw) != digest:
                raise RemoteCorrupt(f"index segment {digest[:12]} does not match its sha256")
            copy.parent.mkdir(parents=True, exist_ok=True)
            tmp = copy.with_name(f".{digest}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_bytes(raw)
            os.replace(tmp, copy)
        try:
            data = json.loads(gzip.decompress(raw).decode("utf-8"))
        except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError):
            raise RemoteCorrupt(f"index segment {digest[:12]} is unreadable") from None
        problem = _segment_problem(data, packs)
        if problem:
            raise RemoteCorrupt(f"index segment {digest[:12]}: {problem}")
        files: dict[str, Any] = data["files"]
        return files

    def index(self, layout: Layout, head: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Every file of the head's segments (a later segment's entry wins)."""
        merged: dict[str, dict[str, Any]] = {}
        for seg in head["segments"]:
            merged.update(self._segment(layout, seg["sha256"], set(seg["packs"])))
        return merged

    # -- restore -----------------------------------------------------------------------------
    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """Download scope `key` into `target` (store.remote.tier.RemoteTier.fetch)."""
        head, _etag = self.read_head(key)
        if head is None:
            return None
        if signing_key:
            reason = mf.signature_problem(head, signing_key)
            if reason:
                raise RemoteCorrupt(f"remote head: {reason}")
        entries = self.index(layout, head)
        target.mkdir()
        scope_dir = str(target)
        # Every directory first, spread over processes by parent (overlay's measured way):
        # the pack workers then only create files, one open each, no failed open + makedirs.
        overlay.make_parents(scope_dir, entries)
        groups = pack_groups(entries)
        bad: set[str] = set()
        problems: list[str] = []
        stats: dict[str, os.stat_result] = {}
        try:
            self._parallel(
                lambda pack: self._unpack(pack, groups[pack], scope_dir, bad, problems, stats),
                sorted(groups),
            )
        except S3Unavailable as exc:
            raise RemoteUnavailable(str(exc)) from None
        if bad:
            self._set_bad(layout, self._bad_packs(layout) | bad)
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

    def _parallel(self, work: Any, items: list[str]) -> None:
        """`work(item)` for every item on WORKERS threads; the first exception is raised
        once the others have stopped (none left waiting for a dead bucket)."""
        if not items:
            return
        with ThreadPoolExecutor(min(WORKERS, len(items))) as pool:
            futures = [pool.submit(work, item) for item in items]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()
            for future in done:
                exc = future.exception()
                if exc is not None:
                    raise exc

    def _unpack(
        self,
        pack: str,
        files: list[tuple[str, dict[str, Any]]],
        root: str,
        bad: set[str],
        problems: list[str],
        stats: dict[str, os.stat_result],
    ) -> None:
        """Download one pack and write its files under `root`, each checked first; each
        written file's stat goes into `stats` (taken from the open file: no second pass)."""
        try:
            got = self.bucket.get(self.pack_key(pack))
        except S3Missing:
            bad.add(pack)
            problems.append(f"missing: pack {pack} ({len(files)} files)")
            return
        assert got is not None
        body = memoryview(got[0])
        for rel, e in files:
            data = body[e["offset"] : e["offset"] + e["size"]]
            if len(data) != e["size"] or _digest(data) != e["sha256"]:
                bad.add(pack)
                problems.append(f"altered: {rel} (pack {pack[:12]})")
                continue
            path = os.path.join(root, rel)
            try:
                fd = os.open(path, _CREATE, _FILE_MODE)
            except FileNotFoundError:  # a directory the tree builder could not make
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, _CREATE, _FILE_MODE)
            try:
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
                st = os.fstat(fd)  # the size and mtime the manifest records (close keeps them)
                if stat.S_IMODE(st.st_mode) != _FILE_MODE:  # a umask took read bits
                    os.fchmod(fd, _FILE_MODE)
            finally:
                os.close(fd)
            stats[rel] = st

    def touch(self, key: str) -> None:
        """PUT the scope's empty last-used marker (one small request)."""
        try:
            self.bucket.put(self.last_used_key(key), b"")
        except (S3Unavailable, S3Missing, S3Conflict) as exc:
            raise RemoteUnavailable(str(exc)) from None

    # -- save --------------------------------------------------------------------------------
    def publish(self, layout: Layout, key: str, signing_key: str | None) -> dict[str, Any]:
        """Upload what the bucket lacks of committed scope `key` (store.remote.tier.RemoteTier)."""
        try:
            local = mf.load(layout.manifest(key))
        except mf.ManifestError as exc:
            return {"published": False, "reason": f"no committed local scope ({exc})"}
        head, etag = self._readable_head(key)
        bad = self._bad_packs(layout)
        remote, dropped = self._usable_index(layout, head, bad)
        missing = sorted(
            rel
            for rel, meta in local["files"].items()
            if remote.get(rel, {}).get("sha256") != meta["sha256"]
        )
        if not missing and head is not None and not dropped:
            return {"published": False, "reason": "the bucket has every file", **self.stats()}
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
        sent = self._upload_packs(scope, upload, local["files"], entries)
        if bad & sent:  # uploaded again, whole: good from now on
            self._set_bad(layout, bad - sent)
        segment = self._put_segment(entries)
        packed = sorted({e["pack"] for e in entries.values()})
        new_seg = {"sha256": segment, "files": len(entries), "packs": packed}
        _fault_pause()
        for _attempt in range(PUBLISH_ATTEMPTS):
            composed = self._compose(layout, key, head, dropped, new_seg, local, signing_key)
            body = (json.dumps(composed, indent=1, sort_keys=True) + "\n").encode()
            try:
                self.bucket.put(
                    self.head_key(key),
                    body,
                    if_match=etag,
                    if_absent=etag is None,
                    content_type="application/json",
                )
                break
            except S3Conflict:
                head, etag = self._readable_head(key)  # another save won: merge with it
                _remote, dropped = self._usable_index(layout, head, bad)
            except (S3Unavailable, S3Missing) as exc:
                raise RemoteUnavailable(str(exc)) from None
        else:
            raise RemoteUnavailable(f"the head kept changing ({PUBLISH_ATTEMPTS} attempts)")
        return {
            "published": True,
            "files": len(entries),
            "new_packs": len(sent),
            "uploaded_files": len(upload),
            **self.stats(),
        }

    def _readable_head(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """The head to extend: a head that is not ours is replaced (its ETag kept)."""
        try:
            return self.read_head(key)
        except RemoteCorrupt:
            try:
                got = self.bucket.get(self.head_key(key))
            except (S3Missing, S3Unavailable) as exc:
                raise RemoteUnavailable(str(exc)) from None
            return None, got[1] if got else None

    def _usable_index(
        self, layout: Layout, head: dict[str, Any] | None, bad: set[str]
    ) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """The head's index without entries in bad packs, and the segments that could not be
        read (dropped from the next head)."""
        if head is None:
            return {}, set()
        merged: dict[str, dict[str, Any]] = {}
        dropped: set[str] = set()
        for seg in head["segments"]:
            try:
                merged.update(self._segment(layout, seg["sha256"], set(seg["packs"])))
            except RemoteCorrupt:
                dropped.add(seg["sha256"])
        usable = {rel: e for rel, e in merged.items() if e["pack"] not in bad}
        if len(usable) != len(merged):
            dropped.add("")  # entries to override: the head must be rewritten
        return usable, dropped

    def _chunks(self, upload: list[str], files: dict[str, Any]) -> Iterator[list[str]]:
        chunk: list[str] = []
        size = 0
        for rel in upload:
            if chunk and size + files[rel]["size"] > PACK_BYTES:
                yield chunk
                chunk, size = [], 0
            chunk.append(rel)
            size += files[rel]["size"]
        if chunk:
            yield chunk

    def _upload_packs(
        self,
        scope: Path,
        upload: list[str],
        files: dict[str, Any],
        entries: dict[str, dict[str, Any]],
    ) -> set[str]:
        """Upload `upload` (paths in `scope`) as packs, adding their entries; the packs' names.
        A file that no longer matches its manifest entry is left out (never published)."""
        chunks = list(self._chunks(upload, files))
        lock = threading.Lock()
        names: set[str] = set()

        def send(index: str) -> None:
            parts: list[bytes] = []
            placed: dict[str, dict[str, Any]] = {}
            offset = 0
            for rel in chunks[int(index)]:
                data = (scope / rel).read_bytes()
                if _digest(data) != files[rel]["sha256"]:
                    continue
                placed[rel] = {"sha256": files[rel]["sha256"], "size": len(data), "offset": offset}
                parts.append(data)
                offset += len(data)
            blob = b"".join(parts)
            name = _digest(blob)
            self.bucket.put(self.pack_key(name), blob)
            with lock:
                names.add(name)
                for rel, e in placed.items():
                    entries[rel] = {**e, "pack": name}

        try:
            self._parallel(send, [str(i) for i in range(len(chunks))])
        except (S3Unavailable, S3Missing, S3Conflict) as exc:
            raise RemoteUnavailable(str(exc)) from None
        return names

    def _put_segment(self, entries: dict[str, dict[str, Any]]) -> str:
        data = {"schema": SEGMENT_SCHEMA, "files": dict(sorted(entries.items()))}
        raw = gzip.compress(json.dumps(data, sort_keys=True).encode(), 6, mtime=0)
        digest = _digest(raw)
        try:
            self.bucket.put(self.segment_key(digest), raw)
        except (S3Unavailable, S3Missing, S3Conflict) as exc:
            raise RemoteUnavailable(str(exc)) from None
        return digest

    def _compose(
        self,
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
            bad = self._bad_packs(layout)
            merged: dict[str, dict[str, Any]] = {}
            for seg in segments:
                files = self._segment(layout, seg["sha256"], set(seg["packs"]))
                merged.update({r: e for r, e in files.items() if e["pack"] not in bad})
            digest = self._put_segment(merged)
            packs = sorted({e["pack"] for e in merged.values()})
            segments = [{"sha256": digest, "files": len(merged), "packs": packs}]
        now = scopes.utc_now()
        composed: dict[str, Any] = {
            "schema": HEAD_SCHEMA,
            "scope_key": key,
            "fingerprint": local.get("fingerprint"),
            "torch_paths": sorted(
                set(local.get("torch_paths") or []) | set((head or {}).get("torch_paths") or [])
            ),
            "created_at": (head or {}).get("created_at") or now,
            "updated_at": now,
            "verification": local.get("verification") or {"references": []},
            "segments": segments,
            "files": sum(int(s.get("files") or 0) for s in segments),
            "total_bytes": local.get("total_bytes", 0),
        }
        if signing_key:
            mf.sign(composed, signing_key)
        return composed
