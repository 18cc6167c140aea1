"""The bucket as the S3 tier sees it: where each object lives, the client (made on first
use), transfer counts, the reads of the index (head and segments), and what this runner
keeps about the bucket (copies of immutable segments, packs found bad, packs it uploaded for
a head it has not published yet)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ci_fxcache import atomic_write
from ci_fxcache.store import manifest as mf
from ci_fxcache.store.layout import LOCKS, Layout
from ci_fxcache.store.remote.packs import Index, sha256_hex
from ci_fxcache.store.remote.s3 import parallel
from ci_fxcache.store.remote.s3.client import (
    Bucket,
    Location,
    S3Missing,
    S3TooLarge,
    S3Unavailable,
    check_config,
)
from ci_fxcache.store.remote.s3.deadline import Deadline, configured_seconds
from ci_fxcache.store.remote.s3.index import (
    MAX_HEAD_BYTES,
    MAX_SEGMENT_OBJECT,
    Head,
    decode_segment,
    encode_segment,
    parse_head,
)
from ci_fxcache.store.remote.tier import REMOTE_DIR, RemoteCorrupt, RemoteUnavailable

# A pack found missing or damaged is not downloaded again by this runner for this long (every
# restore would otherwise fetch and quarantine the same broken copy); then it is tried again,
# since a save elsewhere may have uploaded the same content (a pack's name is its sha256).
BAD_PACK_MEMORY_S = 24 * 3600.0


class HeadTooLarge(RemoteCorrupt):
    """A head object larger than any a save writes (refused before it is read); its ETag,
    for the save that replaces it."""

    def __init__(self, etag: str) -> None:
        super().__init__("remote head is larger than any head a save writes")
        self.etag = etag


class S3Objects:
    """The objects of one bucket prefix, and this runner's memory of them."""

    def __init__(self, where: Location, bucket: Bucket | None = None) -> None:
        check_config()  # a malformed setting is a usage error now, not after a local commit
        self.where = where
        self._bucket = bucket
        self.deadline = Deadline(configured_seconds())
        # The client takes 4-10 ms to make (obstore's import, its HTTP client): made on a
        # thread of its own from now on, while the caller takes the fingerprint or commits
        # locally, so that the first request need not wait for it.
        self._made: list[Bucket | Exception] = []
        self._making: threading.Thread | None = None
        if bucket is None:
            self._making = threading.Thread(
                target=self._make_bucket, name="fxcache-s3 client", daemon=True
            )
            self._making.start()

    def _make_bucket(self) -> None:
        try:
            self._made.append(Bucket(self.where, self.deadline))
        except Exception as exc:  # handed to the first user of the client
            self._made.append(exc)

    def start(self, seconds: float | None = None) -> Deadline:
        """Start the time bound of one operation (a restore, save or invalidate: `seconds`,
        else FXCACHE_S3_DEADLINE's): every request until the next start honours it."""
        self.deadline = Deadline(configured_seconds() if seconds is None else seconds)
        if self._bucket is not None:
            self._bucket.use(self.deadline)
        return self.deadline

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def bucket(self) -> Bucket:
        """The client, made on its thread since this object was; its requests honour the
        operation's deadline."""
        if self._bucket is None:
            if self._making is not None:
                self._making.join()
            made = self._made[0] if self._made else S3Unavailable("the S3 client was not made")
            if isinstance(made, S3Unavailable):
                raise RemoteUnavailable(str(made))
            if isinstance(made, Exception):
                raise made
            self._bucket = made
            self._bucket.use(self.deadline)
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

    def refs_prefix(self, key: str) -> str:
        """Prefix of scope `key`'s references (refs.py), `/` included."""
        return self.where.key("scopes", key, "refs") + "/"

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

    # -- this runner's memory of the bucket --------------------------------------------------
    def runner_dir(self, layout: Layout) -> Path:
        """What this runner keeps about the bucket (immutable segments, bad packs)."""
        ident = sha256_hex(self.describe().encode())[:16]
        return layout.root / REMOTE_DIR / f"s3-{ident}"

    def _bad_record(self, layout: Layout) -> dict[str, float]:
        try:
            data = json.loads((self.runner_dir(layout) / "bad-packs.json").read_text())
        except (OSError, ValueError, RecursionError):
            return {}
        now = time.time()
        if isinstance(data, list):  # the first format: names only
            data = {name: now for name in data}
        if not isinstance(data, dict):
            return {}
        return {
            name: float(at)
            for name, at in data.items()
            if mf.is_digest(name)
            and isinstance(at, int | float)
            and not isinstance(at, bool)
            and now - at < BAD_PACK_MEMORY_S
        }

    def bad_packs(self, layout: Layout) -> set[str]:
        """The packs this runner found missing or damaged (within BAD_PACK_MEMORY_S)."""
        return set(self._bad_record(layout))

    def set_bad(self, layout: Layout, packs: set[str]) -> None:
        """Record the packs found missing or damaged (exactly `packs` from now on): never used
        from the bucket again until this runner uploads that pack itself, or for
        BAD_PACK_MEMORY_S."""
        where = self.runner_dir(layout)
        where.mkdir(parents=True, exist_ok=True)
        known, now = self._bad_record(layout), time.time()
        record = {name: known.get(name, now) for name in sorted(packs)}
        text = json.dumps(record) + "\n"
        atomic_write.write_text(where / "bad-packs.json", text, layout.root / LOCKS)

    def refuse_remembered(self, layout: Layout, entries: Index) -> None:
        """RemoteCorrupt, before any download, when `entries` (a head's index) name a pack
        this runner already found missing or damaged: a broken copy is downloaded once per
        runner, not by every job."""
        bad = self.bad_packs(layout) & {e.pack for e in entries.values()}
        if bad:
            raise RemoteCorrupt(
                f"{len(bad)} pack(s) found missing or damaged earlier on this runner "
                f"(first: {min(bad)[:12]}); not downloaded again"
            )

    @contextlib.contextmanager
    def spool(self, layout: Layout) -> Iterator[BinaryIO]:
        """A nameless file on the store's filesystem that a pack is built into before it is
        sent (removed when closed, also by a kill)."""
        where = self.runner_dir(layout) / "spool"
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where) as f:
            yield f

    # -- packs uploaded for a head not published yet ------------------------------------------
    def _sent_dir(self, layout: Layout, key: str) -> Path:
        return self.runner_dir(layout) / "sent" / key

    def record_sent(
        self,
        layout: Layout,
        key: str,
        pack: str,
        files: Index,
        signing_key: str | None = None,
    ) -> None:
        """Remember that pack `pack` (holding `files`: its entries) is in the bucket, for
        a save of `key` killed before its head: the next save reuses it (sent_packs). Kept
        as a one-pack segment (index.encode_segment), read back with its checks; with a
        signing key, with its MAC beside it (`<pack>.mac`), so that a keyed save reuses only
        records a keyed save wrote."""
        where = self._sent_dir(layout, key)
        where.mkdir(parents=True, exist_ok=True)
        raw = encode_segment({rel: e._replace(pack=pack) for rel, e in files.items()})
        made = (
            [(f"{pack}.mac", _sent_mac(signing_key, key, pack, raw).encode())]
            if signing_key
            else []
        )
        for name, body in [*made, (pack, raw)]:
            tmp = where / f".{name}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_bytes(body)
            os.replace(tmp, where / name)

    def sent_packs(
        self, layout: Layout, key: str, max_age_s: float, signing_key: str | None = None
    ) -> Index:
        """Path -> index entry of the packs this runner uploaded for `key` in
        the last `max_age_s` that no published head of its own named yet. With a signing key,
        only records whose MAC verifies with it: any writer of the runner's store can write a
        record, and a keyed save would otherwise sign a head that names the pack and offsets
        the record says (a wrong one sends every reader cold)."""
        found: Index = {}
        now = time.time()
        for path in sorted(self._sent_dir(layout, key).glob("*")):
            pack = path.name
            if not mf.is_digest(pack):
                continue
            try:
                if now - path.stat().st_mtime >= max_age_s:
                    path.unlink(missing_ok=True)
                    continue
                with path.open("rb") as f:
                    raw = f.read(MAX_SEGMENT_OBJECT + 1)
                if signing_key and not _sent_mac_matches(path, signing_key, key, pack, raw):
                    continue
                found.update(decode_segment(raw, pack, {pack}))
            except (OSError, RemoteCorrupt):
                continue
        return found

    def forget_sent(self, layout: Layout, key: str, packs: set[str]) -> None:
        """Packs a published head now names: nothing to remember."""
        where = self._sent_dir(layout, key)
        for pack in packs:
            (where / pack).unlink(missing_ok=True)
            (where / f"{pack}.mac").unlink(missing_ok=True)

    # -- reading the index -------------------------------------------------------------------
    def head_object(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, ETag) of scope `key`'s head object; None when it has none."""
        try:
            got = self.bucket.get(self.head_key(key), limit=MAX_HEAD_BYTES)
        except S3Missing:
            return None
        except S3TooLarge as exc:
            raise HeadTooLarge(exc.etag) from None
        except S3Unavailable as exc:
            raise RemoteUnavailable(str(exc)) from None
        assert got is not None
        return got

    def read_head(self, key: str) -> tuple[Head | None, str | None]:
        """(head, ETag) of scope `key`, (None, None) when it has none; RemoteCorrupt when the
        head is not one a save wrote."""
        got = self.head_object(key)
        if got is None:
            return None, None
        body, etag = got
        return parse_head(body, key), etag

    def segment(self, layout: Layout, digest: str, named: set[str]) -> Index:
        """The files of segment `digest` (checked against its name; its entries name only
        packs in `named`), from this runner's copy or the bucket; neither is read past
        MAX_SEGMENT_OBJECT bytes."""
        return decode_segment(self.segment_bytes(layout, digest), digest, named)

    def segment_bytes(self, layout: Layout, digest: str, limit: int = MAX_SEGMENT_OBJECT) -> bytes:
        """Segment object `digest` (checked against its name), from this runner's copy or
        the bucket, neither read past `limit` bytes (a reader's: MAX_SEGMENT_OBJECT);
        RemoteCorrupt when it is missing, larger or altered."""
        copy = self.runner_dir(layout) / "segments" / digest
        try:
            with copy.open("rb") as f:
                raw = f.read(limit + 1)
        except OSError:
            raw = b""
        if sha256_hex(raw) == digest:
            return raw
        try:
            got = self.bucket.get(self.segment_key(digest), limit=limit)
        except S3Missing:
            raise RemoteCorrupt(f"index segment {digest[:12]} is missing") from None
        except S3TooLarge:
            raise RemoteCorrupt(f"index segment {digest[:12]} is too large") from None
        except S3Unavailable as exc:
            raise RemoteUnavailable(str(exc)) from None
        assert got is not None
        raw = got[0]
        if sha256_hex(raw) != digest:
            raise RemoteCorrupt(f"index segment {digest[:12]} does not match its sha256")
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_name(f".{digest}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(raw)
        os.replace(tmp, copy)
        return raw

    def index(self, layout: Layout, head: Head) -> Index:
        """Every file of the head's segments (a later segment's entry wins); the segments
        are read at once (one round trip, not one per segment)."""
        segments = head.segments
        found: dict[int, Index] = {}

        def read(i: int) -> None:
            found[i] = self.segment(layout, segments[i].sha256, set(segments[i].packs))

        parallel.run(read, list(range(len(segments))))
        merged: Index = {}
        for i in range(len(segments)):
            merged.update(found[i])
        return merged


_SENT_MAC_CONTEXT = b"fxcache-s3-sent-record/1\0"


def _sent_mac(signing_key: str, key: str, pack: str, raw: bytes) -> str:
    """The MAC of a sent record: bound to the scope, the pack and the record's bytes."""
    payload = _SENT_MAC_CONTEXT + f"{key}\0{pack}\0".encode() + raw
    return hmac.new(signing_key.encode(), payload, hashlib.sha256).hexdigest()


def _sent_mac_matches(path: Path, signing_key: str, key: str, pack: str, raw: bytes) -> bool:
    try:
        with path.with_name(f"{pack}.mac").open("rb") as f:
            given = f.read(65).decode("ascii", "replace")
    except OSError:
        return False
    return hmac.compare_digest(given, _sent_mac(signing_key, key, pack, raw))
