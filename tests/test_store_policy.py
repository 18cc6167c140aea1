"""One store policy (issue 48 point 5): which store a run uses, whether it may write the
remote tier, and the one fallback rule, decided by factory.store_policy for `fxcache restore`
and the action's setup alike. A table of inputs, each through the CLI's path (its flags) and
the action's (its inputs): the same answer."""

from __future__ import annotations

from typing import Any

import pytest

from ci_fxcache.errors import UsageError

S3 = "s3://bucket/fleet"
REDIS = "redis://:pw@cache.internal:6379/0"
AZ = "az://acme-ci-caches/fleet"

# store, s3 or object URL, redis URL, read-only, may write the remote -> kind, may write, a notice?
TABLE = [
    ("local", None, None, False, True, "local", True, False),
    ("s3", S3, None, False, True, "s3", True, False),
    ("s3", S3, None, False, False, "s3", False, False),  # e.g. a pull request's run
    ("s3", S3, None, True, False, "s3", False, False),
    ("s3", None, None, False, True, "local", True, True),  # no address: local only, a notice
    ("redis", None, REDIS, False, True, "redis", True, False),
    ("redis", None, None, False, True, "local", True, True),  # a fork's run has no secrets
    ("redis", None, REDIS, True, False, "local", False, True),  # read-only: Redis stays off
    ("github", None, None, False, True, "github", True, False),
    ("github", None, None, False, False, "github", False, False),
    ("github", None, None, True, False, "github", False, False),
    ("object", AZ, None, False, True, "object", True, False),
    ("object", AZ, None, False, False, "object", False, False),
    ("object", None, None, False, True, "local", True, True),  # no address: local only
]


def _cli(store: str, s3: str | None, redis: str | None, read_only: bool, write: bool) -> Any:
    from ci_fxcache.commands import restore

    url = {"object_url": s3} if store == "object" else {"s3_url": s3}
    return restore.store_policy_of(
        store=store, **{"s3_url": None, **url}, redis_url=redis, key_suffix="gpu-a",
        read_only_reason="--read-only" if read_only else None, remote_read_only=not write,
    )  # fmt: skip


def _action(store: str, s3: str | None, redis: str | None, read_only: bool, write: bool) -> Any:
    from ci_fxcache.action import steps

    url = "object-url" if store == "object" else "s3-url"
    values = {"store": store, "s3-url": "", "object-url": "", url: s3 or "",
              "redis-url": redis or "", "key-suffix": "gpu-a"}  # fmt: skip
    return steps.store_policy_of(values, read_only=read_only, upload=write)


@pytest.mark.parametrize("row", TABLE, ids=[" ".join(map(str, r[:5])) for r in TABLE])
def test_the_cli_and_the_action_decide_the_same_store(
    monkeypatch: pytest.MonkeyPatch, row: tuple[Any, ...]
) -> None:
    store, s3, redis, read_only, write, kind, may_write, noted = row
    for name in ("FXCACHE_S3_URL", "FXCACHE_OBJECT_URL", "FXCACHE_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    cli, action = _cli(store, s3, redis, read_only, write), _action(store, s3, redis, read_only,
                                                                    write)  # fmt: skip
    assert cli == action, (cli, action)
    assert cli.choice.kind == kind
    assert cli.choice.may_write_remote is (may_write and not read_only)
    assert bool(cli.notes) is noted, cli.notes
    assert cli.redis_url == (redis if kind == "redis" else None)
    assert cli.choice.url == (s3 if kind in ("s3", "object") else None)
    assert cli.choice.key_suffix == ("gpu-a" if kind == "github" else "")


def test_an_address_from_the_environment_counts_and_a_malformed_one_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FXCACHE_S3_URL", S3)
    for decide in (_cli, _action):
        assert decide("s3", None, None, False, True).choice.url == S3
    for decide in (_cli, _action):
        with pytest.raises(UsageError):
            decide("s3", "http://not-s3", None, False, True)
        with pytest.raises(UsageError):
            decide("redis", None, "not-a-redis-url", False, True)
        with pytest.raises(UsageError):
            decide("object", "ftp://not-an-object-store/x", None, False, True)
    monkeypatch.setenv("FXCACHE_OBJECT_URL", AZ)
    for decide in (_cli, _action):
        assert decide("object", None, None, False, True).choice.url == AZ
