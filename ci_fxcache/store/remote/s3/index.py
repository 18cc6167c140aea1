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
    signing_key: str | None,
) -> dict[str, Any]:
    """The head that lists `segments` after a save of committed local manifest `local` over
    the current `head` (None: the scope has none), signed when there is a key."""
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
