"""The S3 tier's index objects: the head's and segments' schemas, their checks, their
(de)serialisation, and the head's signature. No I/O here.

The head lists segments by sha256 (and the packs each references), each segment lists files
by sha256 and the frame table of each pack it references (store.remote.packs): signing the
head covers every byte a restore writes.

Segments: `fxcache-s3-segment/2` is zstd JSON `{"schema", "packs": {pack: [[size, stored,
codec], ...]}, "files": {path: {sha256, size, pack, offset}}}`; the first format
(`fxcache-s3-segment/1`, gzip JSON, packs stored raw, no frame table) is still read: its
packs get a table of raw frames, so scopes saved before compression still restore, and a
save that dedupes against them writes their table into its own segment. A segment is
decoded to at most MAX_SEGMENT_JSON bytes: a bomb is refused, never expanded. Writers split
an index into segments within every bound a reader enforces (encode_segments).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import zstandard

from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes
from ci_fxcache.store.remote import packs
from ci_fxcache.store.remote.tier import RemoteCorrupt

HEAD_SCHEMA = "fxcache-s3-head/1"
# A save's reference (refs.py): a head's fields and checks under its own schema, so that a
# signature binds which of the two an object is.
REF_SCHEMA = "fxcache-s3-ref/1"
# A head lists segments (at most publish.MAX_SEGMENTS + 1) and their packs: kilobytes. A
# larger object is refused by its Content-Length before it is read.
MAX_HEAD_BYTES = 16 * 1024 * 1024
SEGMENT_SCHEMA = "fxcache-s3-segment/2"
SEGMENT_SCHEMA_V1 = "fxcache-s3-segment/1"
# What every reader accepts of one segment: its JSON decoded, and its stored object (refused
# by its Content-Length before it is read). The stored bound binds first: the sha256 and the
# hashes in Inductor's paths do not compress (~83 stored bytes a file, ~240 decoded).
MAX_SEGMENT_JSON = 64 * 1024 * 1024
MAX_SEGMENT_OBJECT = 16 * 1024 * 1024
# What a writer puts in one segment at most (encode_segments): well inside both bounds for
# Inductor-shaped paths (5.5-7.6 MB stored, ~16 MB decoded: docs/store.md), so the
# halving that enforces the bounds exactly is a safety net, not the rule.
SEGMENT_FILES = 65_536
_SEGMENT_JSON_TARGET = MAX_SEGMENT_JSON // 2
_ENTRY_JSON = 200  # an entry's JSON besides its path (two digests, three numbers, keys)
# A save reads a segment an older writer made larger than the readers' bounds up to these
# bounds, to split it (publish.py): the next save repairs it instead of dropping it.
REPAIR_SEGMENT_JSON = 4 * MAX_SEGMENT_JSON
REPAIR_SEGMENT_OBJECT = 4 * MAX_SEGMENT_OBJECT
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_MAGIC = b"\x1f\x8b"
_SEGMENT_LEVEL = 3
_SEGMENT_WINDOW = 1 << 23


# Exactly the fields a save writes (a signature only with a signing key); each is checked for
# the type a save gives it where the head is read, so nothing later (a save's composition, the
# collector, the inventory) meets a value of another type.
HEAD_FIELDS = frozenset(
    {
        "schema", "scope_key", "fingerprint", "torch_paths", "created_at", "updated_at",
        "verification", "segments", "files", "total_bytes",
    }
)  # fmt: skip
SEGMENT_REF_FIELDS = frozenset({"sha256", "files", "packs"})


def _is_strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _segment_ref_problem(seg: object) -> str | None:
    if not (isinstance(seg, dict) and set(seg) == SEGMENT_REF_FIELDS):
        return "head lists a malformed segment"
    if not (mf.is_digest(seg["sha256"]) and mf.is_count(seg["files"])):
        return "head lists a malformed segment"
    packs = seg["packs"]
    if not (isinstance(packs, list) and all(mf.is_digest(p) for p in packs)):
        return "head lists a malformed segment"
    return None


def head_problem(head: object, key: str, schema: str = HEAD_SCHEMA) -> str | None:
    """Why a parsed head (or, with REF_SCHEMA, a reference) is not one a save of scope `key`
    wrote, or None: every field of HEAD_FIELDS present with the type a save gives it, and no
    other."""
    if not isinstance(head, dict) or head.get("schema") != schema:
        return "not an fxcache S3 head" if schema == HEAD_SCHEMA else "not an fxcache reference"
    if head.get("scope_key") != key:
        return "head belongs to another scope"
    unknown = sorted(set(head) - HEAD_FIELDS - {"signature"})
    missing = sorted(HEAD_FIELDS - set(head))
    if unknown or missing:
        which = "unknown" if unknown else "missing"
        names = ", ".join([repr(k[:40]) for k in unknown[:5]] + missing)
        return f"head is malformed: {which} field(s) {names}"
    segments = head["segments"]
    if not isinstance(segments, list):
        return "head has no segment list"
    for seg in segments:
        problem = _segment_ref_problem(seg)
        if problem:
            return problem
    if not isinstance(head["fingerprint"], dict):
        return "head fingerprint is malformed"
    if not _is_strings(head["torch_paths"]):
        return "head torch_paths is malformed"
    if not all(isinstance(head[k], str) for k in ("created_at", "updated_at")):
        return "head times are malformed"
    verification = head["verification"]
    if not (
        isinstance(verification, dict)
        and set(verification) == {"references"}
        and _is_strings(verification["references"])
    ):
        return "head verification is malformed"
    if not (mf.is_count(head["files"]) and mf.is_count(head["total_bytes"])):
        return "head file count or total_bytes is malformed"
    signature = head.get("signature")
    if "signature" in head and not (
        isinstance(signature, dict)
        and set(signature) == {"alg", "value"}
        and all(isinstance(signature[k], str) for k in ("alg", "value"))
    ):
        return "head signature is malformed"
    return None


@dataclass(frozen=True)
class SegmentRef:
    """A segment as a head lists it: its object's sha256, its file count, the packs it names."""

    sha256: str
    files: int
    packs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "files": self.files, "packs": list(self.packs)}


@dataclass(frozen=True)
class Head:
    """A scope's head, or (schema REF_SCHEMA) a save's reference: what a restore writes
    (fingerprint, torch paths, times, verification) and the segments that index its files.
    Made only from what head_problem accepted (parse_head) or a save composed (new_head);
    `signature` None when unsigned."""

    schema: str
    scope_key: str
    fingerprint: dict[str, Any]
    torch_paths: tuple[str, ...]
    created_at: str
    updated_at: str
    verification: dict[str, Any]
    segments: tuple[SegmentRef, ...]
    files: int
    total_bytes: int
    signature: dict[str, str] | None = None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Head:
        """From a dict with exactly the fields a save writes (checked: head_problem)."""
        return cls(
            schema=raw["schema"], scope_key=raw["scope_key"], fingerprint=raw["fingerprint"],
            torch_paths=tuple(raw["torch_paths"]), created_at=raw["created_at"],
            updated_at=raw["updated_at"], verification=raw["verification"],
            segments=tuple(
                SegmentRef(s["sha256"], s["files"], tuple(s["packs"])) for s in raw["segments"]
            ),
            files=raw["files"], total_bytes=raw["total_bytes"], signature=raw.get("signature"),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The object's JSON fields (what is signed and stored)."""
        out: dict[str, Any] = {
            "schema": self.schema, "scope_key": self.scope_key, "fingerprint": self.fingerprint,
            "torch_paths": list(self.torch_paths), "created_at": self.created_at,
            "updated_at": self.updated_at, "verification": self.verification,
            "segments": [s.to_json() for s in self.segments], "files": self.files,
            "total_bytes": self.total_bytes,
        }  # fmt: skip
        if self.signature is not None:
            out["signature"] = self.signature
        return out

    @property
    def signed(self) -> bool:
        return self.signature is not None

    def with_signature(self, signature: dict[str, str]) -> Head:
        return replace(self, signature=signature)


def segment_problem(data: object, packs_of_head: set[str]) -> str | None:
    """Why a parsed segment is not one a save wrote referencing only `packs_of_head`, or
    None."""
    if not isinstance(data, dict) or data.get("schema") not in (SEGMENT_SCHEMA, SEGMENT_SCHEMA_V1):
        return "not an fxcache S3 segment"
    files = data.get("files")
    if not isinstance(files, dict):
        return "segment has no file list"
    tables = data.get("packs") if data["schema"] == SEGMENT_SCHEMA else {}
    if not isinstance(tables, dict):
        return "segment has no frame tables"
    extent: dict[str, int] = {}
    for pack, frames in tables.items():
        problem = packs.frames_problem(frames)
        if problem or pack not in packs_of_head:
            return f"segment's pack {str(pack)[:64]!r}: {problem or 'not listed by the head'}"
        extent[pack] = sum(f[0] for f in frames)
    for rel, e in files.items():
        if not (
            mf.safe_relpath(rel)
            and isinstance(e, dict)
            and mf.is_digest(e.get("sha256"))
            and mf.is_count(e.get("size"))
            and mf.is_count(e.get("offset"))
            and e.get("pack") in packs_of_head
            and (data["schema"] == SEGMENT_SCHEMA_V1
                 or e["offset"] + e["size"] <= extent.get(e["pack"], -1))
        ):  # fmt: skip
            return f"segment entry {str(rel)[:200]!r} is malformed"
    return None


def parse_head(body: bytes, key: str, schema: str = HEAD_SCHEMA) -> Head:
    """The head of scope `key` (or, with REF_SCHEMA, a reference) from its object's bytes;
    RemoteCorrupt when it is not one a save wrote."""
    try:
        head = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RemoteCorrupt("remote head is not JSON") from None
    problem = head_problem(head, key, schema)
    if problem:
        raise RemoteCorrupt(problem)
    return Head.of(head)


def encode_head(head: Head) -> bytes:
    """The head object's bytes."""
    return (json.dumps(head.to_json(), indent=1, sort_keys=True) + "\n").encode()


def signature_problem(head: Head, signing_key: str) -> str | None:
    """Why `head` is not signed with `signing_key`, or None."""
    reason = mf.signature_problem(head.to_json(), signing_key)
    return reason.replace("manifest", "remote head", 1) if reason else None


def check_signature(head: Head, signing_key: str) -> None:
    """RemoteCorrupt (signature_problem's reason) unless `head` is signed with `signing_key`."""
    reason = signature_problem(head, signing_key)
    if reason:
        raise RemoteCorrupt(reason)


def new_head(
    key: str,
    head: Head | None,
    segments: list[SegmentRef],
    local: Mapping[str, Any],
    index: packs.Index,
    signing_key: str | None,
    schema: str = HEAD_SCHEMA,
) -> Head:
    """The head (or, with REF_SCHEMA, the reference) that lists `segments` (whose merged
    files are `index`) after a save of committed local manifest `local` over the current
    `head` (None: the scope has none, or it was replaced), signed when there is a key.
    `files` and `total_bytes` are the merged index's own: what a restore of this head
    writes."""
    now = scopes.utc_now()
    composed: dict[str, Any] = {
        "schema": schema,
        "scope_key": key,
        "fingerprint": local["fingerprint"],
        "torch_paths": sorted(set(local["torch_paths"]) | set(head.torch_paths if head else ())),
        "created_at": (head.created_at if head else None) or now,
        "updated_at": now,
        "verification": local["verification"],
        "segments": [s.to_json() for s in segments],
        "files": len(index),
        "total_bytes": sum(e.size for e in index.values()),
    }
    if signing_key:
        mf.sign(composed, signing_key)
    return Head.of(composed)


class SegmentTooLarge(RemoteCorrupt):
    """An index entry that no segment within the readers' bounds can hold."""


class Segment(NamedTuple):
    """A segment object as a writer makes it: its bytes, its file count and its packs."""

    raw: bytes
    files: int
    packs: list[str]

    def ref(self) -> SegmentRef:
        """How a head lists it."""
        return SegmentRef(packs.sha256_hex(self.raw), self.files, tuple(self.packs))


def encode_segments(entries: packs.Index) -> list[Segment]:
    """The segment objects that hold `entries` (byte-identical for identical entries), each
    within what every reader accepts (MAX_SEGMENT_JSON decoded, MAX_SEGMENT_OBJECT stored):
    entries in path order, at most SEGMENT_FILES and about half the decoded bound per segment,
    and a segment that would still exceed a bound is halved until it fits. So a save never
    publishes a segment a restore refuses."""
    found: list[Segment] = []
    for group in _groups(entries):
        found += _fitting(group)
    return found


def _groups(entries: packs.Index) -> list[packs.Index]:
    groups: list[packs.Index] = [{}]
    size = 0
    for rel in sorted(entries):
        cost = len(rel.encode()) + _ENTRY_JSON
        if groups[-1] and (size + cost > _SEGMENT_JSON_TARGET or len(groups[-1]) >= SEGMENT_FILES):
            groups.append({})
            size = 0
        groups[-1][rel] = entries[rel]
        size += cost
    return groups


def _fitting(group: packs.Index) -> list[Segment]:
    text = _segment_json(group)
    raw = _compress(text)
    if len(text) <= MAX_SEGMENT_JSON and len(raw) <= MAX_SEGMENT_OBJECT:
        return [Segment(raw, len(group), sorted({e.pack for e in group.values()}))]
    if len(group) <= 1:
        raise SegmentTooLarge("an index entry is larger than any segment a restore reads")
    rels = sorted(group)
    half = len(rels) // 2
    return _fitting({r: group[r] for r in rels[:half]}) + _fitting(
        {r: group[r] for r in rels[half:]}
    )


def within_bounds(raw: bytes) -> bool:
    """Does every reader accept segment object `raw` (stored and decoded size)?"""
    return len(raw) <= MAX_SEGMENT_OBJECT and _inflate(raw) is not None


def _compress(text: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=_SEGMENT_LEVEL).compress(text)


def encode_segment(entries: packs.Index) -> bytes:
    """One segment object's bytes (zstd JSON, byte-identical for identical entries), whatever
    its size: this runner's own records (objects.record_sent); the bucket gets
    encode_segments'."""
    return _compress(_segment_json(entries))


def _segment_json(entries: packs.Index) -> bytes:
    """A segment's JSON: the files and, once per pack, its frame table (from the entries'
    `frames`)."""
    tables: dict[str, list[packs.Frame]] = {}
    for e in entries.values():
        known = tables.get(e.pack)
        if known is None or (  # a pack's entries mostly share one table: nothing to measure
            e.frames is not known and packs.decoded_size(e.frames) > packs.decoded_size(known)
        ):
            tables[e.pack] = e.frames
    data = {
        "schema": SEGMENT_SCHEMA,
        "packs": {p: [list(f) for f in t] for p, t in sorted(tables.items())},
        "files": {
            rel: {"offset": e.offset, "pack": e.pack, "sha256": e.sha256, "size": e.size}
            for rel, e in sorted(entries.items())
        },
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _inflate(raw: bytes, limit: int = MAX_SEGMENT_JSON) -> bytes | None:
    """The JSON bytes of a segment object, None when it is not one or when it would
    decode to more than `limit`."""
    if raw.startswith(_GZIP_MAGIC):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            text = inflater.decompress(raw, limit + 1)
        except zlib.error:
            return None
        return text if inflater.eof and len(text) <= limit else None
    if not raw.startswith(_ZSTD_MAGIC):
        return None
    try:
        return packs.inflate_bounded(raw, limit, _SEGMENT_WINDOW)
    except (zstandard.ZstdError, packs.TooLarge):
        return None


def decode_segment(
    raw: bytes, digest: str, packs_of_head: set[str], limit: int = MAX_SEGMENT_JSON
) -> packs.Index:
    """The files of segment `digest` from its (already sha256-checked) bytes, each entry
    with its pack's frame table (one list per pack, shared); RemoteCorrupt
    when it is unreadable, larger than `limit` decoded (a reader's: MAX_SEGMENT_JSON), or
    not one a save wrote referencing only `packs_of_head`."""
    text = _inflate(raw, limit)
    try:
        if text is None:
            raise ValueError
        data = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RemoteCorrupt(f"index segment {digest[:12]} is unreadable") from None
    problem = segment_problem(data, packs_of_head)
    if problem:
        raise RemoteCorrupt(f"index segment {digest[:12]}: {problem}")
    files: dict[str, Any] = data["files"]
    if data["schema"] == SEGMENT_SCHEMA:
        tables = {p: [packs.Frame(*f) for f in t] for p, t in data["packs"].items()}
    else:  # the first format: raw packs; a table of raw frames up to the last byte used
        ends: dict[str, int] = {}
        for e in files.values():
            ends[e["pack"]] = max(ends.get(e["pack"], 0), e["offset"] + e["size"])
        tables = {p: packs.raw_frames(end) for p, end in ends.items()}
    entry = packs.Entry
    return {
        rel: entry(e["sha256"], e["size"], e["offset"], e["pack"], tables[e["pack"]])
        for rel, e in files.items()
    }
