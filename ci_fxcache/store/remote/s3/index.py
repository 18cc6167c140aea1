"""The S3 tier's index objects: the head's and segments' schemas, their checks, their
(de)serialisation, and the head's signature. No I/O here.

The head lists segments by sha256 (and the packs each references), each segment lists files
by sha256: signing the head covers every byte a restore writes.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes
from ci_fxcache.store.remote.tier import RemoteCorrupt

HEAD_SCHEMA = "fxcache-s3-head/1"
SEGMENT_SCHEMA = "fxcache-s3-segment/1"


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


def head_problem(head: object, key: str) -> str | None:
    """Why a parsed head is not one a save of scope `key` wrote, or None: every field of
    HEAD_FIELDS present with the type a save gives it, and no other."""
    if not isinstance(head, dict) or head.get("schema") != HEAD_SCHEMA:
        return "not an fxcache S3 head"
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


def segment_problem(data: object, packs: set[str]) -> str | None:
    """Why a parsed segment is not one a save wrote referencing only `packs`, or None."""
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


def parse_head(body: bytes, key: str) -> dict[str, Any]:
    """The head of scope `key` from its object's bytes; RemoteCorrupt when it is not one a
    save wrote."""
    try:
        head = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RemoteCorrupt("remote head is not JSON") from None
    problem = head_problem(head, key)
    if problem:
        raise RemoteCorrupt(problem)
    parsed: dict[str, Any] = head
    return parsed


def encode_head(head: dict[str, Any]) -> bytes:
    """The head object's bytes."""
    return (json.dumps(head, indent=1, sort_keys=True) + "\n").encode()


def signature_problem(head: dict[str, Any], signing_key: str) -> str | None:
    """Why `head` is not signed with `signing_key`, or None."""
    reason = mf.signature_problem(head, signing_key)
    return reason.replace("manifest", "remote head", 1) if reason else None


def check_signature(head: dict[str, Any], signing_key: str) -> None:
    """RemoteCorrupt unless `head` is signed with `signing_key`."""
    reason = mf.signature_problem(head, signing_key)
    if reason:
        raise RemoteCorrupt(f"remote head: {reason}")


def new_head(
    key: str,
    head: dict[str, Any] | None,
    segments: list[dict[str, Any]],
    local: dict[str, Any],
    index: dict[str, dict[str, Any]],
    signing_key: str | None,
) -> dict[str, Any]:
    """The head that lists `segments` (whose merged files are `index`) after a save of
    committed local manifest `local` over the current `head` (None: the scope has none, or
    it was replaced), signed when there is a key. `files` and `total_bytes` are the merged
    index's own: what a restore of this head writes."""
    now = scopes.utc_now()
    composed: dict[str, Any] = {
        "schema": HEAD_SCHEMA,
        "scope_key": key,
        "fingerprint": local["fingerprint"],
        "torch_paths": sorted(set(local["torch_paths"]) | set((head or {}).get("torch_paths", []))),
        "created_at": (head or {}).get("created_at") or now,
        "updated_at": now,
        "verification": local["verification"],
        "segments": segments,
        "files": len(index),
        "total_bytes": sum(e["size"] for e in index.values()),
    }
    if signing_key:
        mf.sign(composed, signing_key)
    return composed


def encode_segment(entries: dict[str, dict[str, Any]]) -> bytes:
    """A segment object's bytes (gzip JSON, byte-identical for identical entries)."""
    data = {"schema": SEGMENT_SCHEMA, "files": dict(sorted(entries.items()))}
    return gzip.compress(json.dumps(data, sort_keys=True).encode(), 6, mtime=0)


def decode_segment(raw: bytes, digest: str, packs: set[str]) -> dict[str, Any]:
    """The files of segment `digest` from its (already sha256-checked) bytes; RemoteCorrupt
    when it is unreadable or not one a save wrote referencing only `packs`."""
    try:
        data = json.loads(gzip.decompress(raw).decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError):
        raise RemoteCorrupt(f"index segment {digest[:12]} is unreadable") from None
    problem = segment_problem(data, packs)
    if problem:
        raise RemoteCorrupt(f"index segment {digest[:12]}: {problem}")
    files: dict[str, Any] = data["files"]
    return files
