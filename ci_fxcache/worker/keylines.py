"""How torch reports one cache lookup in its structured trace, read without torch.

Inductor's FX graph cache and the AOTAutograd cache emit one structured-trace artifact per
lookup (`fx_graph_cache_hit|miss|bypass`, `aotautograd_cache_hit|miss|bypass`). Its JSON payload
carries the key and its `components`, one line per attribute hashed into the key
(`[hash] name: value`). The matrix (worker/keyinfo.py, beside torch) and the job's own trace
(ci_fxcache/jobstats, in the orchestrator) both read lookups through this module, which imports
nothing but the standard library.
"""

from __future__ import annotations

import re
from typing import Any

# Artifact name prefix -> the cache it reports on.
ARTIFACTS = {"fx_graph_cache_": "fxgraph", "aotautograd_cache_": "aotautograd"}
STATES = ("hit", "miss", "bypass")
HASH_CHARS = 12
VALUE_CHARS = 200
_LINE = re.compile(r"^\[(?P<hash>[^\]\s]+)\] (?P<name>[^:\n]+?): (?P<value>.*)$", re.S)


def lookup_kind(artifact_name: str) -> tuple[str, str] | None:
    """(cache, state) of a lookup artifact (`fx_graph_cache_miss` -> fxgraph, miss; the state
    is the name's last word, one of STATES in torch 2.13-2.15); None for any other artifact."""
    for prefix, cache in ARTIFACTS.items():
        if artifact_name.startswith(prefix):
            return cache, artifact_name.rsplit("_", 1)[-1]
    return None


def parse_components(lines: list[Any], value_chars: int = VALUE_CHARS) -> dict[str, list[Any]]:
    """`{name: [hash, value]}` from torch's debug lines; value None when not printable text,
    cut to `value_chars`. Anything that is not such a line is skipped."""
    out: dict[str, list[Any]] = {}
    for line in lines:
        match = _LINE.match(line) if isinstance(line, str) else None
        if match is None:
            continue
        value: str | None = match["value"]
        if value is not None and not value.isprintable():
            value = None  # a pickle or a source hash: only its hash says anything
        elif value is not None and len(value) > value_chars:
            value = value[:value_chars] + "..."
        out[match["name"]] = [match["hash"][:HASH_CHARS], value]
    return out


def bypass_reason(info: dict[str, Any]) -> str | None:
    """torch's reason for a bypass, cut to VALUE_CHARS (None when it gave none)."""
    reason = info.get("cache_bypass_reason")
    return str(reason).strip()[:VALUE_CHARS] if reason else None
