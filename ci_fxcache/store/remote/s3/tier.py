"""`store: s3` as a backend of the remote tier (store.remote.tier.RemoteTier): the bucket's
objects (objects.py) with restore (fetch.py), save (publish.py) and the last-used marker."""

from __future__ import annotations

from pathlib import Path

from ci_fxcache.store.layout import Layout
from ci_fxcache.store.manifest import Committed
from ci_fxcache.store.remote.s3 import fetch, publish
from ci_fxcache.store.remote.s3.client import S3Conflict, S3Missing, S3Unavailable
from ci_fxcache.store.remote.s3.deadline import TOUCH_S
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import Fetched, Published, RemoteUnavailable


class S3Tier(S3Objects):
    """The S3 backend of the remote tier (store.remote.tier.RemoteTier)."""

    name = "s3"
    read_only = False
    publishes_every_save = True  # a save that added nothing completes a killed one's upload

    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """Download scope `key` into `target` (store.remote.tier.RemoteTier.fetch), within one
        time bound (deadline.py)."""
        self.start()
        return fetch.fetch(self, layout, key, target, signing_key)

    def publish(
        self, layout: Layout, key: str, committed: Committed, signing_key: str | None
    ) -> Published:
        """Upload what the bucket lacks of committed scope `key` (store.remote.tier.RemoteTier),
        within one time bound (deadline.py)."""
        self.start()
        return publish.publish(self, layout, key, committed, signing_key)

    def touch(self, key: str) -> None:
        """PUT the scope's empty last-used marker (one small request), best-effort: at most
        TOUCH_S of what is left of the restore's bound."""
        self.start(self.deadline.capped(TOUCH_S))
        try:
            self.bucket.put(self.last_used_key(key), b"")
        except (S3Unavailable, S3Missing, S3Conflict) as exc:
            raise RemoteUnavailable(str(exc)) from None
