"""The one place that turns the store choice into a remote-tier backend."""

from __future__ import annotations

from ci_fxcache.store.remote.tier import RemoteTier


def check_settings(store: str) -> None:
    """UsageError when the environment's settings of `store`'s tier are malformed (for s3:
    FXCACHE_S3_TIMEOUT, FXCACHE_S3_DEADLINE): checked before anything is committed."""
    if store == "s3":
        from ci_fxcache.store.remote.s3 import client

        client.check_config()


def tier_for(store: str, url: str | None) -> RemoteTier | None:
    """The backend that the CLI's `--store` names (None for stores without tier 2)."""
    if store == "s3":
        # Imported here, not at the top: only `store: s3` pays its start-up (~12 ms measured),
        # and restore runs on every job's critical path.
        from ci_fxcache.store.remote.s3 import client, tier

        return tier.S3Tier(client.resolve_url(url))
    return None
