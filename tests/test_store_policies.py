"""Invalidation policies as pure functions (shared by the local store and GitHub caches)."""

from __future__ import annotations

import pytest

from ci_fxcache.env import scopekey
from ci_fxcache.errors import UsageError
from ci_fxcache.store.policies import Entry, Policy, parse_duration, parse_size, select

DAY = 86400.0
NOW = 1_000 * DAY


def entry(torch: str, arch: str, days: float, size: int, n: int) -> Entry:
    accel = "cpu" if arch == "cpu" else "cu12.8"
    archs = "" if arch == "cpu" else f"-{arch}"
    key = scopekey.parse(f"fxcache-v1-linux-x86_64-cp311-torch{torch}-{accel}{archs}-{n:012x}")
    assert key is not None
    return Entry(name=f"e{n}", key=key, last_used=NOW - days * DAY, size=size)


def names(selected: list[Entry]) -> list[str]:
    return sorted(e.name for e in selected)


def test_parsers() -> None:
    assert parse_duration("14d") == 14 * DAY and parse_duration("90s") == 90
    assert parse_size("50G") == 50 * 1024**3 and parse_size("1.5MiB") == int(1.5 * 1024**2)
    for bad in ("14", "d", "-1d"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    with pytest.raises(UsageError):
        parse_size("lots")


def test_policies_combine() -> None:
    entries = [
        entry("2.13.0", "sm90", 1, 10, 1),
        entry("2.13.0", "sm90", 3, 10, 2),
        entry("2.13.0", "sm90", 20, 10, 3),
        entry("2.12.0", "sm80", 2, 10, 4),
        entry("2.13.0", "cpu", 5, 100, 5),
    ]
    assert names(select(entries, Policy(max_age_s=14 * DAY), NOW)) == ["e3"]
    assert names(select(entries, Policy(keep_latest=1), NOW)) == ["e2", "e3"]
    assert names(select(entries, Policy(older_torch_than="2.13.0"), NOW)) == ["e4"]
    # LRU eviction runs after the other policies, over what they keep.
    chosen = select(entries, Policy(max_age_s=14 * DAY, max_size=25), NOW)
    assert names(chosen) == ["e2", "e3", "e5"]
    assert chosen[0].reasons  # every selected entry says why
    both = select(entries, Policy(max_age_s=14 * DAY, keep_latest=1), NOW)
    e3 = next(e for e in both if e.name == "e3")
    assert len(e3.reasons) == 2
