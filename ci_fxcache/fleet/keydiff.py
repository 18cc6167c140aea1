"""Two environments side by side: which keyed fingerprint fields differ, and which reported ones.

A side is a scope key, a fingerprint JSON file (`fxcache fingerprint --json`, or a bare
fingerprint object) or a results document (`fxcache verify --json`). Keyed fields decide the
scope (a difference means two caches); reported fields (driver, GPU names, paths) do not. A
bare key carries only its readable parts and a hash: when only the hash differs, the keyed
fields behind it are named only if both sides bring their fingerprint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache.env import scopekey
from ci_fxcache.env.fingerprint import Fingerprint
from ci_fxcache.errors import UsageError
from ci_fxcache.results import reader

# What a bare key's readable parts stand for.
KEY_PARTS = {
    "os": "os",
    "machine": "machine",
    "abi": "python_abi",
    "torch": "torch_version",
    "accel": "accelerator",
    "archs": "gpu_archs",
    "pool": "runner pool (GPU models, CPU ISA)",
    "hash": "fingerprint hash",
}
# Derived or bookkeeping entries of Fingerprint.to_dict() that are not facts of their own.
_NOT_REPORTED = ("schema", "device_kind", "gpu_archs", "gpu_models")


@dataclass(frozen=True)
class Side:
    """One environment: where it came from, its scope key, its fingerprint when known."""

    source: str
    key: str
    fingerprint: Fingerprint | None


def from_document(doc: Any, source: str) -> Side:
    """A side from a fingerprint or results document (UsageError when it is neither)."""
    if not isinstance(doc, dict):
        raise UsageError(f"{source}: not a fingerprint or results document (expected an object)")
    if doc.get("schema") == reader.MERGED_SCHEMA:
        raise UsageError(
            f"{source}: a merged document holds several environments; pass one shard's results"
        )
    data = doc.get("fingerprint") if "fingerprint" in doc else doc
    fp = Fingerprint.from_dict(data) if isinstance(data, dict) and "torch_version" in data else None
    key = str(doc.get("scope_key") or (scopekey.scope_key(fp) if fp is not None else ""))
    if not key:
        raise UsageError(f"{source}: has neither a fingerprint nor a scope key")
    return Side(source, key, fp)


def load(arg: str) -> Side:
    """A side from a scope key or a JSON file path."""
    if scopekey.parse(arg) is not None:
        return Side(arg, arg, None)
    path = Path(arg)
    if not path.is_file():
        raise UsageError(
            f"{arg}: neither an fxcache scope key nor a file; pass a key, a fingerprint JSON "
            "(fxcache fingerprint --json) or a results JSON (fxcache verify --json)"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{arg}: cannot read it as JSON ({exc})") from None
    return from_document(doc, arg)


def _changes(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"field": name, "a": a.get(name), "b": b.get(name)}
        for name in sorted(a.keys() | b.keys())
        if a.get(name) != b.get(name)
    ]


def _key_parts(key: str) -> dict[str, Any]:
    parsed = scopekey.parse(key)
    if parsed is None:
        return {"scope key": key}
    parts = parsed.to_dict()
    return {label: parts[name] for name, label in KEY_PARTS.items()}


def _reported(fp: Fingerprint) -> dict[str, Any]:
    keyed = fp.keyed_fields()
    facts = {k: v for k, v in fp.to_dict().items() if k not in keyed and k not in _NOT_REPORTED}
    facts["gpus"] = [f"{g.name} ({g.arch})" for g in fp.gpus]
    return facts


def scope(key: str) -> str:
    """The key without its free-form suffix (the key itself when it is not ours)."""
    parsed = scopekey.parse(key)
    return parsed.scope if parsed is not None else key


def diff(a: Side, b: Side) -> dict[str, Any]:
    """`{"a", "b", "same_scope", "keyed": [{"field","a","b"}], "reported": [...]}`."""
    if a.fingerprint is not None and b.fingerprint is not None:
        keyed = _changes(a.fingerprint.keyed_fields(), b.fingerprint.keyed_fields())
        reported = _changes(_reported(a.fingerprint), _reported(b.fingerprint))
    else:  # a bare key on one side: its readable parts are all there is to compare
        keyed, reported = _changes(_key_parts(a.key), _key_parts(b.key)), []
    return {
        "a": scope(a.key),
        "b": scope(b.key),
        "same_scope": scope(a.key) == scope(b.key),
        "keyed": keyed,
        "reported": reported,
    }


def render(result: dict[str, Any]) -> str:
    """The diff as text lines for the terminal."""
    lines = [f"A: {result['a']}", f"B: {result['b']}"]
    verdict = "same scope" if result["same_scope"] else "different scopes: two separate caches"
    lines.append(verdict)
    for kind, title in (("keyed", "keyed fields"), ("reported", "reported fields (not keyed)")):
        changes = result[kind]
        lines.append(f"{title} that differ: {len(changes) or 'none'}")
        lines += [f"  {c['field']}: {c['a']!r} -> {c['b']!r}" for c in changes]
    if result["keyed"] and [c["field"] for c in result["keyed"]] == ["fingerprint hash"]:
        lines.append("  (only the hash differs: pass both fingerprints to see which fields)")
    return "\n".join(lines)
