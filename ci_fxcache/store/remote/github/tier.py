"""`store: github` as a backend of the remote tier (store.remote.tier): a thin adapter over
the Actions cache client (store.remote.github.cache_service), which keeps the protocol.

An entry is one archive of the whole scope directory (manifest included) under an immutable
key: fetch downloads the newest entry of the scope by key prefix, publish uploads the
committed scope as this run's entry. GitHub records each entry's last access itself, so
`touch` sends nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ci_fxcache.store.layout import Layout
from ci_fxcache.store.manifest import Committed
from ci_fxcache.store.remote.github import cache_service
from ci_fxcache.store.remote.tier import Fetched, RemoteCorrupt, RemoteUnavailable


def entry_prefix(scope_key: str, key_suffix: str) -> str:
    """The key prefix of scope `scope_key`'s entries (the one a restore looks up): the scope,
    then the key suffix. Entries are immutable: each run saves under the prefix plus
    `run<id>.<attempt>` (cache_service.entry_key)."""
    return f"{scope_key}-{key_suffix + '-' if key_suffix else ''}"


class GitHubTier:
    """The Actions cache as tier 2: save under `save_key`, restore by `restore_prefix`."""

    name = "github"
    read_only = False
    publishes_every_save = False  # each publish is a new immutable entry

    def __init__(
        self, service: cache_service.CacheService, save_key: str, restore_prefix: str
    ) -> None:
        self._service = service
        self.save_key = save_key
        self.restore_prefix = restore_prefix
        self.matched: str | None = None

    def describe(self) -> str:
        """For messages."""
        return "the GitHub cache"

    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """Download the newest entry of the scope into `target`, every file checked against
        the archive's manifest as it is written (the local restore that follows checks the
        manifest itself: its signature with a signing key)."""
        try:
            restored = cache_service.restore_directory(
                self._service, target, self.save_key, [self.restore_prefix]
            )
        except cache_service.ArchiveUnusable as exc:
            raise RemoteCorrupt(str(exc)) from None
        except cache_service.CacheServiceError as exc:
            raise RemoteUnavailable(str(exc)) from None
        if restored is None:
            return None
        self.matched = restored.matched
        done = restored.unpacked
        return Fetched(done.files, done.total_bytes, {"matched_key": self.matched}, done.seal)

    def publish(
        self, layout: Layout, key: str, committed: Committed, signing_key: str | None
    ) -> dict[str, Any]:
        """Upload the committed scope (`committed`, its save's manifest) as entry `save_key`."""
        try:
            sent = cache_service.save_directory(
                self._service, layout.scope(key), self.save_key, committed
            )
        except cache_service.CacheServiceError as exc:
            raise RemoteUnavailable(str(exc)) from None
        return {"published": bool(sent.pop("uploaded")), **sent}

    def touch(self, key: str) -> None:
        """Nothing to send: the service records each entry's last access."""

    def stats(self) -> dict[str, Any]:
        """Not counted for this backend."""
        return {}
