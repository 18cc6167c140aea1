"""Invalidation policies, shared by the local store and the GitHub Actions caches.

Policies combine: an entry goes when any policy selects it. `--max-size` runs last, evicting the
least recently used of what the other policies keep until the total fits.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from ci_fxcache.env import scopekey
from ci_fxcache.env.torch_support import release
from ci_fxcache.errors import UsageError

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_UNITS_B = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_duration(text: str) -> float:
    """`14d`, `12h`, `30m`, `90s`, `2w` -> seconds; UsageError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not match:
        raise UsageError(f"bad duration {text!r}: use a number and s, m, h, d or w (e.g. 14d)")
    return float(match[1]) * _UNITS_S[match[2]]


def parse_size(text: str) -> int:
    """`50G`, `500M`, `1.5T`, `1024` (binary units; a trailing `iB`/`B` is accepted) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"bad size {text!r}: use a number with K, M, G or T (e.g. 50G)")
    return int(float(match[1]) * _UNITS_B[match[2].upper()])


def parse_torch_version(text: str) -> str:
    """A torch version for `--older-torch-than` (`2.12`, `2.13.0+cu128`); UsageError otherwise."""
    if not re.fullmatch(r"\s*\d+(\.\d+){0,2}([a-z]+\d*)?(\+[\w.]+)?\s*", text):
        raise UsageError(f"bad torch version {text!r}: use e.g. 2.12 or 2.13.0, or 'current'")
    return text.strip()


@dataclass(frozen=True)
class Policy:
    """The policies of one `fxcache invalidate` run (None: not used)."""

    max_age_s: float | None = None
    max_size: int | None = None
    keep_latest: int | None = None
    older_torch_than: str | None = None

    @property
    def empty(self) -> bool:
        """True when no policy was given."""
        return (
            self.max_age_s is None
            and self.max_size is None
            and self.keep_latest is None
            and self.older_torch_than is None
        )


@dataclass
class Entry:
    """One cache: a local scope or a GitHub Actions cache entry."""

    name: str
    key: scopekey.ParsedKey
    last_used: float
    size: int
    ident: str = ""  # GitHub cache id
    quarantined: bool = False  # a scope moved aside (kept for inspection only)
    reasons: list[str] = field(default_factory=list)


def _age(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.1f}d" if days >= 1 else f"{seconds / 3600:.1f}h"


def select(entries: list[Entry], policy: Policy, now: float) -> list[Entry]:
    """Mark each entry's reasons to go; return those with at least one."""
    for entry in entries:
        entry.reasons = []
    if policy.max_age_s is not None:
        for entry in entries:
            idle = now - entry.last_used
            if idle > policy.max_age_s:
                entry.reasons.append(f"unused for {_age(idle)} > {_age(policy.max_age_s)}")
    if policy.keep_latest is not None:
        by_pool: dict[str, list[Entry]] = defaultdict(list)
        for entry in entries:
            if entry.quarantined:  # never one of the "latest": it is not served
                continue
            by_pool[entry.key.runner_pool].append(entry)
        for pool, group in by_pool.items():
            group.sort(key=lambda e: e.last_used, reverse=True)
            for entry in group[policy.keep_latest :]:
                entry.reasons.append(f"beyond the {policy.keep_latest} latest for {pool}")
    if policy.older_torch_than is not None:
        limit = release(policy.older_torch_than)
        for entry in entries:
            if release(entry.key.torch) < limit:
                entry.reasons.append(f"torch {entry.key.torch} < {policy.older_torch_than}")
    if policy.max_size is not None:
        # Quarantined entries go first: they only serve inspection.
        kept = sorted(
            (e for e in entries if not e.reasons), key=lambda e: (not e.quarantined, e.last_used)
        )
        total = sum(e.size for e in kept)
        for entry in kept:
            if total <= policy.max_size:
                break
            entry.reasons.append(
                f"least recently used while total {human_bytes(total)} > "
                f"{human_bytes(policy.max_size)}"
            )
            total -= entry.size
    return [e for e in entries if e.reasons]
