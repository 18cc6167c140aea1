"""`fxcache invalidate --github` against the strict local GitHub stand-in."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from tests.conftest import RunFxcache
from tests.fake_github import FakeGitHub

KEY = "fxcache-v1-linux-x86_64-cp311-torch{torch}-cu12.8-sm90-{h:012x}-run-{run}"
CACHES = "/repos/octo-org/fxcache-demo/actions/caches"


def _ago(days: float) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _populate(fake: FakeGitHub) -> tuple[set[int], set[int]]:
    """250 of our caches (3 pages) plus foreign ones; return (old ids, fresh ids)."""
    old, fresh = set(), set()
    for i in range(250):
        days = 30 if i % 5 == 0 else 1
        entry = fake.add_cache(
            KEY.format(torch="2.13.0", h=i, run=i), size=1000, last_accessed_at=_ago(days)
        )
        (old if days > 14 else fresh).add(entry["id"])
    fake.add_cache("fxcache-vx-not-our-format", last_accessed_at=_ago(90))
    fake.add_cache("Linux-pip-deadbeef", last_accessed_at=_ago(90))
    return old, fresh


def test_removes_only_old_caches_of_our_format(
    fake_github: FakeGitHub, run_fxcache: RunFxcache
) -> None:
    old, fresh = _populate(fake_github)
    proc = run_fxcache(
        "invalidate", "--github", "--max-age", "14d", "--json", env=fake_github.env()
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert {r["id"] for r in rows} == old and len(old) == 50
    assert all(r["action"] == "removed" and r["store"] == "github" for r in rows)
    left = {c["id"] for c in fake_github.caches}
    assert fresh <= left and not old & left
    assert {c["key"] for c in fake_github.caches} >= {
        "fxcache-vx-not-our-format",
        "Linux-pip-deadbeef",
    }
    lists = fake_github.calls("GET", CACHES)
    assert len(lists) == 3  # one request per page of 100, none per entry
    first = lists[0].query
    assert first["per_page"] == ["100"] and first["key"] == ["fxcache-v"]
    assert first["sort"] == ["last_accessed_at"]
    assert len(fake_github.calls("DELETE", CACHES + r"/\d+")) == 50
    assert all(r.status == 204 for r in fake_github.calls("DELETE", CACHES + r"/\d+"))


def test_dry_run_and_keep_latest_never_delete(
    fake_github: FakeGitHub, run_fxcache: RunFxcache
) -> None:
    _populate(fake_github)
    proc = run_fxcache(
        "invalidate", "--github", "--keep-latest", "200", "--dry-run", env=fake_github.env()
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^would remove +github +", proc.stdout, re.M)
    assert "50 cache(s), would free" in proc.stdout
    assert "beyond the 200 latest for linux-x86_64-sm90" in proc.stdout
    assert fake_github.calls("DELETE") == [] and len(fake_github.caches) == 252


def test_rate_limits_and_5xx_are_retried(fake_github: FakeGitHub, run_fxcache: RunFxcache) -> None:
    old, _fresh = _populate(fake_github)
    fake_github.fail("GET", CACHES, 429, headers={"Retry-After": "1"})
    fake_github.fail("GET", CACHES, 403, {"message": "API rate limit exceeded"},
                     headers={"Retry-After": "1"})  # fmt: skip
    fake_github.fail("DELETE", CACHES + r"/\d+", 502, {"message": "Bad Gateway"})
    proc = run_fxcache(
        "invalidate", "--github", "--max-age", "14d", "--json", env=fake_github.env()
    )
    assert proc.returncode == 0, proc.stderr
    assert {r["id"] for r in json.loads(proc.stdout)["rows"]} == old
    assert not old & {c["id"] for c in fake_github.caches}
    statuses = [r.status for r in fake_github.requests]
    assert statuses[:2] == [429, 403] and 502 in statuses


def test_missing_write_permission_is_one_line(
    fake_github: FakeGitHub, run_fxcache: RunFxcache
) -> None:
    _populate(fake_github)
    fake_github.read_only = True
    proc = run_fxcache("invalidate", "--github", "--max-age", "14d", env=fake_github.env())
    assert proc.returncode == 2
    assert "needs 'permissions: actions: write'" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_missing_token_is_a_usage_error(fake_github: FakeGitHub, run_fxcache: RunFxcache) -> None:
    env = {**fake_github.env(), "GITHUB_TOKEN": ""}
    proc = run_fxcache("invalidate", "--github", "--max-age", "14d", env=env)
    assert proc.returncode == 2 and "GITHUB_TOKEN" in proc.stderr
