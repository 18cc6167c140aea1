"""`store: s3` as a backend of the remote tier (store.remote.tier.RemoteTier): the bucket's
objects (objects.py) with restore (fetch.py), save (publish.py) and the last-used marker."""

from __future__ import annotations

import threading
from pathlib import Path

from ci_fxcache.store.layout import Layout
from ci_fxcache.store.manifest import Committed
from ci_fxcache.store.remote.s3 import fetch, publish
from ci_fxcache.store.remote.s3.client import (
    Bucket,
    Location,
    S3Conflict,
    S3Missing,
    S3Unavailable,
)
from ci_fxcache.store.remote.s3.deadline import TOUCH_S, Deadline
from ci_fxcache.store.remote.s3.objects import S3Objects
from ci_fxcache.store.remote.tier import Fetched, Published, RemoteUnavailable


class _Marking:
    """The last-used marker's PUT on a thread of its own, within its own bound."""

    def __init__(self, tier: S3Tier, key: str, deadline: Deadline) -> None:
        self.key = key
        self._failed: list[Exception] = []
        self._thread = threading.Thread(
            target=self._put, args=(tier, deadline), name="fxcache-s3 last-used", daemon=True
        )
        self._thread.start()

    def _put(self, tier: S3Tier, deadline: Deadline) -> None:
        try:
            tier.bucket.put(tier.last_used_key(self.key), b"", deadline=deadline)
        except (S3Unavailable, S3Missing, S3Conflict, RemoteUnavailable) as exc:
            self._failed.append(exc)

    def result(self) -> None:
        """Wait for the PUT (its bound, TOUCH_S, ends it); RemoteUnavailable when it failed."""
        self._thread.join(TOUCH_S + 1)
        if self._thread.is_alive():
            raise RemoteUnavailable(f"no answer within {TOUCH_S:g} s")
        if self._failed:
            raise RemoteUnavailable(str(self._failed[0])) from None


class S3Tier(S3Objects):
    """The S3 backend of the remote tier (store.remote.tier.RemoteTier)."""

    name = "s3"
    read_only = False
    publishes_every_save = True  # a save that added nothing completes a killed one's upload

    def __init__(
        self, where: Location, bucket: Bucket | None = None, *, marks_use: bool = True
    ) -> None:
        super().__init__(where, bucket)
        # Whether a fetch that finds the scope sends its last-used marker at once (beside the
        # packs' downloads, not after them): not where this run may not write the bucket
        # (factory.tier_for).
        self.marks_use = marks_use
        self._marking: _Marking | None = None

    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """Download scope `key` into `target` (store.remote.tier.RemoteTier.fetch), within one
        time bound (deadline.py). Once the scope is found, its last-used marker is sent beside
        the downloads (`touch` then waits for it): so a fetch that then fails has marked the
        scope used all the same."""
        self.start()
        found = self._found if self.marks_use else None
        return fetch.fetch(self, layout, key, target, signing_key, found)

    def _found(self, key: str) -> None:
        self._marking = _Marking(self, key, self.deadline.sub(TOUCH_S))

    def publish(
        self, layout: Layout, key: str, committed: Committed, signing_key: str | None
    ) -> Published:
        """Upload what the bucket lacks of committed scope `key` (store.remote.tier.RemoteTier),
        within one time bound (deadline.py)."""
        self.start()
        return publish.publish(self, layout, key, committed, signing_key)

    def touch(self, key: str) -> None:
        """PUT the scope's empty last-used marker (one small request), best-effort: at most
        TOUCH_S of what is left of the restore's bound. After a fetch of `key`, the one its
        fetch sent."""
        marking, self._marking = self._marking, None
        if marking is None or marking.key != key:
            marking = _Marking(self, key, self.deadline.sub(TOUCH_S))
        marking.result()
