"""The one place that turns the store choice into a remote-tier backend.

The choice is a frozen value (`StoreChoice`) decided once: from the CLI's flags, or by the
action's setup. `tier_for` builds every backend of tier 2 (S3, GitHub's Actions cache) from
it; a run that may not write the remote gets the backend wrapped in `ReadOnly`. Redis is
torch's own remote cache beside the tiers, never a tier. `invalidator_for` turns the same
choice into what `fxcache invalidate` cleans, for every kind (the local store and Redis too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ci_fxcache.errors import UsageError
from ci_fxcache.store.remote.tier import ReadOnly, RemoteTier

if TYPE_CHECKING:
    from ci_fxcache.store.invalidate import Invalidator
    from ci_fxcache.store.remote.s3.tier import S3Tier

KINDS = ("local", "redis", "s3", "github", "object")
TIER_KINDS = ("s3", "github", "object")  # the kinds with a tier 2 (object: s3, gs, az by URL)


@dataclass(frozen=True, kw_only=True)
class StoreChoice:
    """Which store a run uses: the kind, the bucket URL (s3; None: $FXCACHE_S3_URL), the
    key suffix (github: entries of one scope told apart) and whether this run may write the
    remote tier (False: it reads it only)."""

    kind: str
    url: str | None = None
    key_suffix: str = ""
    may_write_remote: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"unknown store {self.kind!r}: one of {', '.join(KINDS)}")

    @property
    def has_tier(self) -> bool:
        """Whether a remote tier stands behind the local store."""
        return self.kind in TIER_KINDS


def choose(
    kind: str,
    *,
    url: str | None = None,
    key_suffix: str = "",
    read_only: bool,
    remote_read_only: bool,
) -> StoreChoice:
    """The one decision of which store a run uses, for the CLI's flags and the action's setup
    alike: `kind` with its URL and key suffix, and whether the run may write the remote tier
    (neither a read-only run nor one told to only read the remote may)."""
    return StoreChoice(
        kind=kind, url=url or None, key_suffix=key_suffix,
        may_write_remote=not (read_only or remote_read_only),
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class StorePolicy:
    """What store_policy decided: the store (`choice`), torch's Redis URL when Redis is on,
    and the notices saying why a store asked for is not used."""

    choice: StoreChoice
    redis_url: str | None = None
    notes: tuple[str, ...] = ()


def store_policy(
    kind: str,
    *,
    s3_url: str | None,
    redis_url: str | None,
    key_suffix: str,
    read_only: bool,
    may_write_remote: bool,
    object_url: str | None = None,
) -> StorePolicy:
    """The store policy, for `fxcache restore` (its flags) and the action's setup (its
    inputs) alike: which store, whether the run may write its remote tier (never a read-only
    run, nor one its caller lets only read: choose), and the one fallback rule:

    - a store whose address is missing (no URL given, none in $FXCACHE_S3_URL /
      $FXCACHE_OBJECT_URL / $FXCACHE_REDIS_URL; a fork's run gets no secrets) runs local
      only, with a notice: a cache never fails a job for want of its address;
    - Redis is off for a read-only run (torch's remote cache would write what trusted runs
      load): local only, with a notice;
    - a malformed address is a usage error (UsageError), never a fallback."""
    notes: list[str] = []
    url = None
    if kind in ("s3", "object"):
        url = _tier_url(kind, s3_url if kind == "s3" else object_url, notes)
    elif kind == "redis":
        redis_url = _redis_url(redis_url, read_only, notes)
    chosen = "local" if notes else kind
    choice = choose(
        chosen, url=url,
        key_suffix=key_suffix if chosen == "github" else "", read_only=read_only,
        remote_read_only=chosen in TIER_KINDS and not may_write_remote,
    )  # fmt: skip
    return StorePolicy(choice=choice, redis_url=redis_url if chosen == "redis" else None,
                       notes=tuple(notes))  # fmt: skip


def _tier_url(kind: str, given: str | None, notes: list[str]) -> str | None:
    """The bucket URL of store s3 / object (given, else from the environment), checked; None
    with a notice in `notes` when there is none."""
    from ci_fxcache.store.remote.s3 import client

    flag, env = (
        ("--s3-url", client.URL_ENV) if kind == "s3" else ("--object-url", client.OBJECT_URL_ENV)
    )
    url = given or os.environ.get(env) or None
    if url is None:
        notes.append(f"store {kind} without an {flag[2:]} ({flag}, {env}): local only")
    elif kind == "s3":
        check_s3_url(url, flag if given else env)
    else:
        check_object_url(url, flag if given else env)
    return url


def _redis_url(given: str | None, read_only: bool, notes: list[str]) -> str | None:
    """Torch's Redis URL (given, else from the environment), checked; a notice in `notes`
    when there is none or the run is read-only (Redis then stays off)."""
    from ci_fxcache.store.remote import redis_cache

    url = redis_cache.configured_url(given)
    if url is None:
        notes.append(
            "store redis without a redis-url (--redis-url, FXCACHE_REDIS_URL; a fork's run "
            "has no secrets): local only"
        )
        return None
    redis_cache.check_url(url)
    if read_only:
        notes.append(
            "read-only run: torch's Redis remote cache stays off, so nothing reaches the "
            "shared cache (local only)"
        )
    return url


def check_s3_url(url: str, what: str) -> None:
    """UsageError (naming `what`, never repeating the value) unless `url` is s3://BUCKET/PREFIX."""
    from ci_fxcache.store.remote.s3 import client

    client.parse_url(url, what)


def check_object_url(url: str, what: str) -> None:
    """UsageError (naming `what`, never repeating the value) unless `url` is an object-store
    URL of a service the tier serves (s3://, gs://, az://, file:///PATH)."""
    from ci_fxcache.store.remote.s3 import client

    client.parse_url(url, what, client.SCHEMES)


def check_settings(choice: StoreChoice) -> None:
    """UsageError when the environment's settings of the choice's tier are malformed (for s3:
    FXCACHE_S3_TIMEOUT, FXCACHE_S3_DEADLINE): checked before anything is committed."""
    if choice.kind in ("s3", "object"):
        from ci_fxcache.store.remote.s3 import client

        client.check_config()


def tier_for(choice: StoreChoice) -> RemoteTier | None:
    """The backend of the choice (None for stores without tier 2), wrapped in ReadOnly when
    this run may not write it. Every backend takes the scope key on each call."""
    tier: RemoteTier
    match choice.kind:
        case "local" | "redis":
            return None
        case "s3":
            tier = s3_tier(choice.url, marks_use=choice.may_write_remote)
        case "object":
            tier = object_tier(choice.url, marks_use=choice.may_write_remote)
        case "github":
            from ci_fxcache.store.remote.github import tier as github

            tier = github.GitHubTier(choice.key_suffix)
        case other:
            raise UsageError(f"unknown store {other!r}")
    return tier if choice.may_write_remote else ReadOnly(tier)


def invalidator_for(
    choice: StoreChoice,
    *,
    root: Path | None = None,
    gc_grace_s: float | None = None,
    github_token: str | None = None,
    signing_key: str | None = None,
) -> Invalidator:
    """What `fxcache invalidate` applies its policies to, for every kind of store: the local
    `root` (both trust namespaces), the S3 bucket (`choice.url`, else $FXCACHE_S3_URL;
    unreferenced objects older than `gc_grace_s` collected), GitHub's Actions caches (the
    job's `github_token`, else $GITHUB_TOKEN), Redis (`choice.url`, else $FXCACHE_REDIS_URL);
    with `signing_key`, the bucket's signed references are folded too.
    UsageError when the store's settings are missing or malformed."""
    match choice.kind:
        case "local":
            from ci_fxcache.store.invalidate import LocalStore

            if root is None:
                raise ValueError("the local store needs its root")
            return LocalStore(root)
        case "s3":
            from ci_fxcache.store.remote.s3 import invalidate as s3_invalidate

            grace = s3_invalidate.DEFAULT_GRACE_S if gc_grace_s is None else gc_grace_s
            return s3_invalidate.Bucket(s3_tier(choice.url), grace, signing_key)
        case "object":
            from ci_fxcache.store.remote.s3 import invalidate as s3_invalidate

            grace = s3_invalidate.DEFAULT_GRACE_S if gc_grace_s is None else gc_grace_s
            return s3_invalidate.Bucket(object_tier(choice.url), grace, signing_key)
        case "github":
            from ci_fxcache.store.remote.github import invalidate as github_invalidate

            return github_invalidate.ActionsCaches(github_token)
        case "redis":
            from ci_fxcache.store.remote import redis_cache

            return redis_cache.IdleKeys(redis_cache.resolve_url(choice.url))
        case other:
            raise UsageError(f"unknown store {other!r}")


def s3_tier(url: str | None, *, marks_use: bool = True) -> S3Tier:
    """The S3 backend itself (invalidation works on its objects): `url`, else $FXCACHE_S3_URL;
    UsageError when neither is an s3:// URL. `marks_use`: whether its fetch sends the
    last-used marker (not where this run may not write the bucket)."""
    # Imported here, not at the top: only `store: s3` pays its start-up (~12 ms measured),
    # and restore runs on every job's critical path.
    from ci_fxcache.store.remote.s3 import client
    from ci_fxcache.store.remote.s3 import tier as s3

    return s3.S3Tier(client.resolve_url(url), marks_use=marks_use)


def object_tier(url: str | None, *, marks_use: bool = True) -> S3Tier:
    """The tier of `--store object`: the service the URL's scheme names (s3://, gs://, az://, file://),
    `url`, else $FXCACHE_OBJECT_URL; the same tier as s3's on every service. Named `object`
    in the restore's state (a save rebuilds it from there) unless the URL is s3://."""
    from ci_fxcache.store.remote.s3 import client
    from ci_fxcache.store.remote.s3 import tier as s3

    where = client.resolve_object_url(url)
    tier = s3.S3Tier(where, marks_use=marks_use)
    if where.scheme != "s3":
        tier.name = "object"
    return tier
